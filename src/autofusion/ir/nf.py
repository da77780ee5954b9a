"""The NF codes: why two groups do not fuse, one table with meanings.

In: nothing. Out: one constant per code, and `CODES` (code -> short meaning), which the README's
table of NF codes documents entry by entry (tests/ir/test_nf.py keeps the two and the source in step).

NF1xxx follow CANN's fusion-failure codes; NF2xxx are this compiler's own. A code is produced only
through these constants, so `autofusion explain` and the logs cannot spell one that has no meaning.
"""

from __future__ import annotations

CYCLE = "NF1002"
NO_OUTPUTS = "NF1004"
SPACES_DIFFER = "NF1006"
TOO_MANY_INPUTS = "NF1007"
TOO_MANY_NODES = "NF1010"
DTYPE = "NF2002"
NO_KERNEL_LOWERING = "NF2003"
NON_TRAILING_REDUCTION = "NF2004"
MERGING_RESHAPE = "NF2005"
ON_CHIP_BUDGET = "NF2006"
NOT_PROFITABLE = "NF2007"
NO_FUSE_SCOPE = "NF2008"
SCOPE_MISMATCH = "NF2009"
DISABLED_NODE = "NF2100"
MERGE_LIMIT = "NF2101"

CODES: dict[str, str] = {
    CYCLE: "a path between the two groups leaves the merged group and comes back (a cycle)",
    NO_OUTPUTS: "the group has no outputs, or reads a value it neither computes nor takes as input",
    SPACES_DIFFER: "the iteration spaces differ (outputs or reductions of different shapes)",
    TOO_MANY_INPUTS: "the merged kernel would read more input buffers than max_inputs",
    TOO_MANY_NODES: "the merged kernel would hold more nodes than max_fusion_size",
    DTYPE: "a value has a dtype kernels do not compute in",
    NO_KERNEL_LOWERING: "an op has no loop-kernel lowering (it runs through ATen)",
    NON_TRAILING_REDUCTION: (
        "a reduction over non-trailing dims whose input is contiguous along neither the innermost kept "
        "nor the innermost reduced dim (either loop order would stride through memory)"
    ),
    MERGING_RESHAPE: "a reshape that merges dims of a computed value",
    ON_CHIP_BUDGET: (
        "a reduction row over the on-chip budget makes the multi-pass kernel cost more than fusing saves"
    ),
    NOT_PROFITABLE: "the cost model finds no net benefit",
    NO_FUSE_SCOPE: "the op is marked super_kernel_scope(None)",
    SCOPE_MISMATCH: "the two sides are in different SuperKernel scopes",
    DISABLED_NODE: "a node on the disable list (disable_fusion)",
    MERGE_LIMIT: "past the merge limit (max_merges, used by autofusion bisect)",
}
