"""The graph passes before fusion planning, in the order they run, each switchable by name.

Order, and why:

 1. constant_folding            literals and constants first, so later rules see plain values
 2. algebraic_simplify          drop identities (x*1, neg(neg x), lossless double casts, ...)
 3. cse                         one node per (op, inputs, attrs), after 1-2 made more of them equal
 4. layout_transpose_eliminate  cancel transpose pairs, fold transposes into matmul operands
 5. horizontal_pattern          sibling matmuls -> one matmul + slices, after every vertical rule,
                                so horizontal merging never breaks a longer vertical chain
 6. dce                         drop what the rewrites left unused
Then the pipeline applies the fusion rules (vertical pattern rules: larger scope and longer chains
first) and decomposes composites, then (`after_rules_passes`)
 7. channels_last               the route and layout of each chain of convolutions, measured; after
                                the rules, so it routes their conv_bn_act calls too, and before
                                fusion, so fusion sees the real data layout
 8. channels_last_scale         a per-channel scale (squeeze-excite) between two channels-last
                                convolutions stays channels-last (passes/layout_scale.py)
 9. linear_post_op              Linear + GELU as one oneDNN call with a post-op where measured
                                faster per shape; before fusion, which would otherwise put the
                                GELU in a kernel of its own or a GEMM epilogue
and the fusion solver groups kernels: vertical candidates
before horizontal ones (`horizontal_kernel`, sibling kernels with the same iteration space),
larger shared buffers first, stable order, and a merge that fails a budget (size, on-chip) is never
retried as part of a larger group (resource monotonicity).

Every pass is a pure function Graph -> Graph keeping the invariants in passes/README.md. A pass
whose name is in `Options.disabled` is skipped; `horizontal_kernel` is the solver's switch.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Sequence

from autofusion.cache import Cache
from autofusion.events import EventRecord
from autofusion.hw.profile import HardwareProfile
from autofusion.ir.graph import Graph
from autofusion.ir.verify import verify
from autofusion.passes import layout
from autofusion.passes.horizontal import merge_sibling_matmuls
from autofusion.passes.layout import choose_layouts, eliminate_transposes
from autofusion.passes.layout_scale import keep_scales_channels_last
from autofusion.passes.linear_post_op import Decide, fuse_linear_post_ops
from autofusion.passes.simplify.algebra import simplify
from autofusion.passes.simplify.cse import eliminate_common_subexpressions
from autofusion.passes.simplify.dce import eliminate_dead_nodes
from autofusion.passes.simplify.fold import fold_constants

log = logging.getLogger("autofusion.passes")

Pass = Callable[[Graph], Graph]
# A pass after the rules also takes `origin` (see `choose_layouts`), so the rules' node-indexed results
# can follow its rebuild.
LatePass = Callable[..., Graph]

# Names a user can switch off; horizontal_kernel and gemm_epilogue are the fusion solver's, not passes here.
PASS_NAMES = ("constant_folding", "algebraic_simplify", "cse", "layout_transpose_eliminate",
              "horizontal_pattern", "channels_last", "channels_last_scale", "linear_post_op",
              "horizontal_kernel", "gemm_epilogue")  # fmt: skip


def graph_passes(
    profile: HardwareProfile | None = None, cache_dir: Cache | str | None = None, frozen: bool = False
) -> list[tuple[str, Pass]]:
    """The named passes in order; `profile` feeds the cost checks that need one, `cache_dir` (a Cache
    or its root) keeps the convolution timings channels_last measures; `frozen`: parameter-only values
    will be folded once per version (passes/freeze.py), so rewrites that compute on weights are free."""
    return [
        ("constant_folding", fold_constants),
        ("algebraic_simplify", simplify),
        ("cse", eliminate_common_subexpressions),
        ("layout_transpose_eliminate", eliminate_transposes),
        ("horizontal_pattern", functools.partial(merge_sibling_matmuls, profile=profile, frozen=frozen)),
        ("dce", eliminate_dead_nodes),
    ]


def after_rules_passes(cache_dir: Cache | str | None = None, conv_layout: str = "auto",
                       conv_chain_layouts: Sequence[str] = (),
                       events: list[EventRecord] | None = None,
                       linear_post_op: Decide | None = None) -> list[tuple[str, LatePass]]:  # fmt: skip
    """The named passes that run after the fusion rules and decomposition, before the solver:
    `channels_last` routes chains of convolutions, including the rules' conv_bn_act calls (measured,
    or as `conv_layout` / `conv_chain_layouts` force: Options'); its decisions go to `events`.
    `channels_last_scale` then keeps per-channel scales between channels-last convolutions NHWC;
    `linear_post_op` fuses Linear + GELU into one call where `linear_post_op` (the decider, measured
    per shape by the runtime) says so; without a decider it changes nothing."""
    route = functools.partial(choose_layouts, timer=layout.timer_for(cache_dir), layout=conv_layout,
                              chain_layouts=tuple(conv_chain_layouts), events=events)  # fmt: skip
    return [
        ("channels_last", route),
        ("channels_last_scale", keep_scales_channels_last),
        ("linear_post_op", functools.partial(fuse_linear_post_ops, decide=linear_post_op)),
    ]


def run_passes(graph: Graph, disabled: Collection[str] = frozenset(), profile: HardwareProfile | None = None,
               *, check: bool = False) -> Graph:  # fmt: skip
    """Run every pass not in `disabled`, in order; with `check`, verify the IR after each."""
    g = graph
    for name, fn in [*graph_passes(profile), *after_rules_passes()]:
        if name in disabled:
            log.info("pass %s is disabled", name)
            continue
        before = len(g.nodes)
        g = fn(g)
        if g is not graph:
            log.debug("pass %s: %d -> %d nodes", name, before, len(g.nodes))
        if check:
            verify(g)
    return g
