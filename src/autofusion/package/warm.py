"""The first call's weight work, done when saving: folded parameter values and oneDNN-packed weights.

In (`capture`, at save): a compiled signature's program and captured graph, after it ran. Out: a record
of what its first call computed from the weights alone: the values of its frozen parameter-only
subgraph (`runtime/frozen.py`: concatenated Q/K/V weights, say), and every linear weight it packed for
oneDNN (`runtime/prepack.py`'s packed linears, and the weights of the Linear + GELU calls with the GELU
as oneDNN's post-op, `runtime/library.py`'s `post_op_linear`), each as bytes with oneDNN's descriptor
(`runtime/packed_blob.py`) and named by what it was packed from (a graph input, a folded value or a
plan constant). `apply` (at load) puts them back in place, so the first call finds them as a second
call would. Weights packed for MKL's packed GEMM are not stored: their bytes only work at the address
(modulo 64 KiB) they were packed at (`packed_blob.py` says more), so they are packed at the first call.

Only what cannot be stale is stored or applied:
- folded values only where the weights they come from are stored in the package too (`weights="copy"`)
  and bound from it (no model given to `load`): a model's own weights may differ from those saved;
- a folded value or packed weight only when it was computed from the weights as they are now (each
  source the same tensor at the same version);
- packed weights only on a machine with the CPU features they were packed with (oneDNN's blocked format
  follows the ISA), and only for sources that are present as saved.
After load the usual guards hold: a weight replaced or changed in place (its version moves) is folded
and packed again before it is used, as in a compiled model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from autofusion.hw.isa import features_digest
from autofusion.runtime import packed_blob
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.library import FOLDS

log = logging.getLogger("autofusion.package")

Sources = list[torch.Tensor | None]  # per graph input: the tensor it reads, None for a user input


def bound_inputs(sources: Sequence[tuple[str, Any]]) -> Sources:
    """Per graph input of a captured graph: the weight or bound tensor it reads now (None: a user input)."""
    return [v.get() if kind == "live" else (v if kind == "bound" else None) for kind, v in sources]


def _version(t: torch.Tensor) -> int:
    return -1 if t.is_inference() else t._version


def _fold_bound(ex: FoldedExecutor, inputs: Sources) -> bool:
    """Whether every input the fold reads is a weight or bound tensor (never a user input)."""
    return all(inputs[i] is not None for i in ex.split.fold_inputs)


def _filled(inputs: Sources) -> list[torch.Tensor]:
    """`inputs` with an empty tensor for each user input (which the fold never reads)."""
    return [t if t is not None else torch.empty(0) for t in inputs]


# The fold cache's tags of oneDNN-packed weights, by kind: ("prepack", "onednn", m, transposed, id(w))
# (runtime/prepack.py) and ("linear_post_op", m, id(w)) (library.post_op_linear), each followed by the
# weight's (data_ptr, version, dtype, shape). Per kind, the tag fields kept in the package: all but the
# weight's id, which at load is the loaded weight's.
PACKED_KINDS = {"prepack": 3, "linear_post_op": 1}


def _packed_entries() -> list[tuple[tuple[Any, ...], torch.Tensor, torch.Tensor]]:
    """(tag, weight, packed weight) of each oneDNN-packed weight in the fold cache that is current."""
    out = []
    with FOLDS.lock:
        items = list(FOLDS.items.items())
    for key, (refs, value) in items:
        n = PACKED_KINDS.get(key[0]) if key else None
        if n is None or len(key) != n + 3 or len(refs) != 1 or refs[0] is None:
            continue
        if key[0] == "prepack" and key[1] != "onednn":  # MKL's packed bytes do not move (module doc)
            continue
        w = refs[0]()
        if w is None or key[-1] != (w.data_ptr(), _version(w), w.dtype, tuple(w.shape)):
            continue
        out.append((key[: n + 1], w, value[0]))  # the kind and the fields kept
    return out


def capture(
    program: Any,
    inputs: Sources,
    weights_copied: bool,
    routes: dict[Any, str] | None,
    exported: dict[int, Any],
) -> dict[str, Any] | None:
    """What `apply` needs to skip the first call's weight work for this program (None: nothing).
    `routes`: the route of each linear shape (m, k, n, dtype) the program runs packed: only weights
    packed for those are stored. `exported`: packed weights already exported by this save (shared)."""
    ex = program.executor
    folded: tuple[torch.Tensor, ...] | None = None
    if weights_copied and isinstance(ex, FoldedExecutor) and _fold_bound(ex, inputs):
        folded = ex.current(_filled(inputs))
    names: dict[int, tuple[str, Any]] = {}
    for pos, t in enumerate(inputs):
        if t is not None and weights_copied:
            names.setdefault(id(t), ("input", pos))
    for k, v in enumerate(folded or ()):
        names.setdefault(id(v), ("fold", k))
    for name, c in program.plan.graph.constants.items():
        names.setdefault(id(c), ("const", name))
    wanted = {(route, m) for (m, *_), route in (routes or {}).items()}
    packed = []
    for tag, w, p in _packed_entries():
        source = names.get(id(w))
        # A post-op linear is packed only where the plan runs that call: its packing needs no route.
        if source is None or (tag[0] == "prepack" and (tag[1], tag[2]) not in wanted):
            continue
        if id(p) not in exported:
            exported[id(p)] = (p, packed_blob.export(p))  # p kept: its id stays its own while saving
        got = exported[id(p)][1]
        if got is None:
            continue
        raw, md = got
        packed.append({"kind": tag[0], "tag": list(tag[1:]), "source": source, "raw": raw,
                       "shape": list(p.shape), "stride": list(p.stride()), "md": md,
                       "dtype": p.dtype})  # fmt: skip
    if folded is None and not packed:
        return None
    return {"folded": folded, "packed": packed, "cpu": features_digest()}


def apply(
    executor: Any, plan: Any, inputs: Sources, warm: dict[str, Any] | None, weights_copied: bool
) -> int:
    """Put a stored `capture` back: returns how many packed weights were rebuilt (tests read it)."""
    if warm is None:
        return 0
    values: tuple[torch.Tensor, ...] = ()
    folded = warm["folded"]
    if (
        folded is not None
        and weights_copied
        and isinstance(executor, FoldedExecutor)
        and _fold_bound(executor, inputs)
    ):
        executor.seed(_filled(inputs), folded)
        values = executor.current(_filled(inputs)) or ()
    if warm["cpu"] != features_digest():
        if warm["packed"]:
            log.info("autofusion.load: the stored packed weights were packed on a CPU with other features; "
                     "packing them again at the first call")  # fmt: skip
        return 0
    rebuilt = 0
    for rec in warm["packed"]:
        kind, ref = rec["source"]
        w: torch.Tensor | None = None
        if kind == "input" and weights_copied and 0 <= ref < len(inputs):
            w = inputs[ref]
        elif kind == "fold" and 0 <= ref < len(values):
            w = values[ref]
        elif kind == "const":
            w = plan.graph.constants.get(ref)
        if w is None:
            continue
        p = packed_blob.rebuild(rec["raw"], rec["shape"], rec["stride"], rec["md"], rec["dtype"])
        if p is None:
            continue
        entry = rec.get("kind", "prepack")  # packages before post-op weights were stored: "prepack" only
        if PACKED_KINDS.get(entry) != len(rec["tag"]):
            log.info("autofusion.load: a stored packed weight of unknown kind %r; packing it at the "
                     "first call", entry)  # fmt: skip
            continue
        value = (p, rec["raw"])  # the bytes stay referenced as long as the packed weight
        FOLDS.get((entry, *rec["tag"], id(w)), [w], lambda v=value: v, single=True)  # type: ignore[misc]
        rebuilt += 1
    return rebuilt
