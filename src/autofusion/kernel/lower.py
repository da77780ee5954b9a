"""Lower a fused group of IR nodes to a loop-level kernel (`LoopKernel`), or say why it cannot be.

In: the group's nodes (topological order), the values it reads from outside and the values it must
write. Out: a `LoopKernel`: the iteration space, one loop "stage" per round of reductions, and in each
stage a straight-line list of statements (loads, computes, accumulations, stores) over index
expressions. `codegen/cpp/render.py` prints it as C++; the planner calls `lower_group` on every
candidate merge, so "legal to fuse" means exactly "this lowering succeeds" (`NotExpressible` names why).

Algorithm. The kernel iterates over one space F = outer (kept) dims + reduced (inner) dims. All
reductions in a group reduce the same dims of the same shape S (several reductions over one axis share
the kernel). When those dims are not S's trailing dims, F is S with its dims reordered, kept dims
first, each side in S's order (`LoopKernel.perm`): values are still emitted in their own coordinates
and only the map from F's loop indices to S's dims changes, so loads keep their strides and the
renderer chooses the loop order (rows, or columns when a kept dim is the contiguous one: tile.py).
Values are pulled: emitting a value at an index emits its inputs at the indices its op maps to
(broadcast, permute, slice, select, split-reshape, flip, pad, concat, gather), so view ops cost
index arithmetic, not memory. Views applied directly to kernel inputs fold into the input's
strides (merging reshapes included); a merging reshape of a computed value would need div/mod
indexing and is refused. A reduction of depth d (d reductions on its longest input path) runs in
stage d; full-space outputs are stored in a final stage, per-row outputs after the last stage.
Expressions are memoised per (value, index, stage), so a value used twice at one index is computed once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import pairwise
from typing import Any

from autofusion.ir import nf
from autofusion.ir.catalog import BINARY, UNARY
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Node
from autofusion.ir.types import TensorType
from autofusion.kernel.index import Ix, broadcast_index, offset_of

MAX_CARRIED_ROW = 65536  # default carry limit in elements when no profile budget is given
REDUCE_COMBINE = {"sum": "add", "amax": "max", "amin": "min", "prod": "mul"}
# The wide unsigned types are here although torch barely computes on them: ONNX models do, and in C++
# they are plain unsigned integers (render.py gives each its wrap-around, comparison and division).
FUSIBLE_DTYPES = frozenset(
    {DType.float32, DType.float16, DType.bfloat16, DType.int32, DType.int64, DType.bool, DType.uint16,
     DType.uint32, DType.uint64}
)  # fmt: skip
_ELEMENTWISE = UNARY | BINARY | {"where", "lerp"}
_CHEAP = frozenset({"add", "sub", "mul", "neg", "cast", "abs"})
_CHEAP_OPS = 2
HALF = frozenset({DType.float16, DType.bfloat16})
# smallest normal and largest finite value per float dtype
_NORMAL_RANGE = {
    DType.float16: (2.0**-14, 65504.0),
    DType.bfloat16: (2.0**-126, 3.3895313892515355e38),
    DType.float32: (2.0**-126, 3.4028234663852886e38),
    DType.float64: (2.0**-1022, 1.7976931348623157e308),
}
# ops whose result is one of their inputs (exactly), so a half value stays exact through them
_KEEPS_HALF = frozenset({"where", "neg", "abs", "relu", "maximum", "minimum"})


def exact_reciprocal(value: Any, dtype: DType) -> float | None:
    """1/value when multiplying by it is bit-identical to dividing by `value` for every input: `value` is a
    power of two and both it and its reciprocal are normal numbers of `dtype` (and of float32, which
    kernels compute in). Otherwise None: keep the division."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not dtype.is_float:
        return None
    v = float(value)
    if not math.isfinite(v) or v == 0.0:
        return None
    mant, _ = math.frexp(abs(v))
    if mant != 0.5:
        return None
    tiny, big = _NORMAL_RANGE.get(dtype, _NORMAL_RANGE[DType.float32])
    r = 1.0 / v
    lo, hi = max(tiny, _NORMAL_RANGE[DType.float32][0]), min(big, _NORMAL_RANGE[DType.float32][1])
    return r if lo <= abs(v) <= hi and lo <= abs(r) <= hi else None


def _dim_set(dims: Sequence[int], rank: int) -> frozenset[int]:
    """The dims a reduction reduces (all for an empty list; none of a 0-d input, whose dim -1 is itself)."""
    if rank == 0:
        return frozenset()
    return frozenset(d % rank for d in dims) if dims else frozenset(range(rank))


class NotExpressible(Exception):
    """The group cannot become one kernel; `code` is an NF reason code, the message says why."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Buffer:
    """A kernel argument: the value it holds, its type and whether the kernel writes it."""

    vid: int
    type: TensorType  # for inputs, the strides the kernel will be called with
    is_output: bool


class StmtKind(StrEnum):
    """What a statement does; a StrEnum, so it compares, prints and serialises as its value."""

    LOAD = "load"  # var = buffer[buf] at offset
    COMPUTE = "compute"  # var = op(args)
    LITERAL = "literal"  # var = value
    INDEX = "index"  # var = start + step * offset (an iteration index as a value)
    STORE = "store"  # buffer[buf] at offset = var
    ACC = "acc"  # accumulator var op= args[0]
    ROWSTORE = "rowstore"  # per-thread row buffer `value` at offset = var
    ROWLOAD = "rowload"  # var = per-thread row buffer `value` at offset


@dataclass(frozen=True)
class Stmt:
    """One statement of a lowered kernel."""

    kind: StmtKind
    var: str = ""
    dtype: DType = DType.float32  # the value's IR dtype (halves compute in fp32)
    op: str = ""
    args: tuple[str, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    buf: int = -1
    offset: Ix | None = None
    value: Any = None

    def __post_init__(self) -> None:
        # A plain string is accepted and checked (an unknown kind fails here, not in the renderer).
        object.__setattr__(self, "kind", StmtKind(self.kind))


@dataclass(frozen=True)
class Accumulator:
    """A reduction's running value in a kernel."""

    var: str
    op: str  # sum / amax / amin / prod
    dtype: DType
    stage: int
    nan_flag: bool = True  # a float max/min keeps a NaN flag (kernel/nan_flags.py says when not)


@dataclass(frozen=True)
class LoopKernel:
    """A fused kernel lowered to loops: its iteration space, buffers and statements per stage."""

    name: str
    space: tuple[int, ...]
    n_outer: int
    buffers: tuple[Buffer, ...]
    stages: tuple[tuple[Stmt, ...], ...]  # stage k (0-based) runs its own loop over the inner dims
    accumulators: tuple[Accumulator, ...]
    pre: tuple[Stmt, ...]  # per-row statements before stage 0 (rarely used: row-invariant loads)
    post: tuple[Stmt, ...]  # per-row statements after the last stage (outer-space outputs)
    nodes: tuple[Node, ...] = ()
    row_buffers: tuple[tuple[str, DType], ...] = ()  # per-thread row scratch carrying values across stages
    # space[k] is dim perm[k] of the reductions' input shape (kept dims first); () when in order
    perm: tuple[int, ...] = ()

    @property
    def n_reduce(self) -> int:
        return len(self.space) - self.n_outer

    @property
    def is_reduction(self) -> bool:
        return self.n_outer < len(self.space) or bool(self.accumulators)

    def all_stmts(self) -> list[Stmt]:
        return [*self.pre, *(s for st in self.stages for s in st), *self.post]


@dataclass(frozen=True)
class _View:
    """A buffer seen through a view: its shape, strides and offset."""

    buf: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


def reshape_strides(
    shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]
) -> tuple[int, ...] | None:
    """Strides that view (shape, strides) as new_shape without a copy, or None when impossible."""
    if math.prod(shape) == 0:
        return tuple(0 for _ in new_shape)
    old = [(s, st) for s, st in zip(shape, strides, strict=True) if s != 1]
    out = [0] * len(new_shape)
    new_idx = [i for i, s in enumerate(new_shape) if s != 1]
    oi = ni = 0
    while oi < len(old) or ni < len(new_idx):
        o0, n0, po, pn = oi, ni, 1, 1
        while True:
            if pn <= po and ni < len(new_idx) and (pn < po or oi >= len(old) or pn == 1):
                pn *= new_shape[new_idx[ni]]
                ni += 1
            elif oi < len(old):
                po *= old[oi][0]
                oi += 1
            else:
                return None
            if po == pn and oi > o0 and ni > n0:
                break
        chunk = old[o0:oi]
        for (_, st_a), (s_b, st_b) in pairwise(chunk):
            if st_a != st_b * s_b:
                return None
        stride = chunk[-1][1]
        for k in reversed(new_idx[n0:ni]):
            out[k] = stride
            stride *= new_shape[k]
    return tuple(out)


class _Lowerer:
    def __init__(self, name: str, nodes: Sequence[Node], inputs: Sequence[int], outputs: Sequence[int],
                 types: dict[int, TensorType], supports: Callable[[Node], str | None],
                 max_carried_row: int = MAX_CARRIED_ROW) -> None:  # fmt: skip
        self.name = name
        self.supports = supports
        self.max_carried_row = max_carried_row
        self.nodes = tuple(nodes)
        self.producer = {v.id: n for n in nodes for v in n.outputs}
        self.types = types
        self.input_ids = list(inputs)
        self.output_ids = list(outputs)
        self.buffers = [Buffer(v, types[v], False) for v in inputs] + [
            Buffer(v, types[v].contiguous(), True) for v in outputs
        ]
        self.buf_of = {v: i for i, v in enumerate(inputs)}
        self.memo: dict[tuple[Any, ...], str] = {}
        self.counter = 0
        self.accs: dict[int, Accumulator] = {}
        self._find_space()
        n_stages = self.max_depth + (1 if self.full_outputs or not self.reductions else 0)
        self.stages: list[list[Stmt]] = [[] for _ in range(max(n_stages, 1))]
        self.pre: list[Stmt] = []
        self.post: list[Stmt] = []
        # Index of the reductions' input shape (and of full-space outputs) in the kernel's loop dims.
        self.full_index = tuple(Ix.dim(self.pos[d]) for d in range(len(self.space)))
        self.full_key = tuple(ix.key() for ix in self.full_index)
        inner = self.space[self.n_outer :]
        self.inner_numel = math.prod(inner)
        strides = [1] * len(inner)
        for k in range(len(inner) - 2, -1, -1):
            strides[k] = strides[k + 1] * inner[k + 1]
        self.row_offset = offset_of(
            tuple(Ix.dim(self.n_outer + k) for k in range(len(inner))), tuple(strides), 0
        )
        self.row_buffers: dict[int, str] = {}
        self.invariant: set[str] = set()  # variables that do not change along the reduced dims
        # Up to two cheap ops on loads (a variance's x - x0, of a half input's cast): a later stage
        # recomputes them from the cache-hot row instead of carrying them, a store per element. Value:
        # how many ops the variable's expression has.
        self.cheap: dict[str, int] = {}
        self.kinds: dict[str, StmtKind] = {}
        # Variables of a half dtype that hold a value of that dtype exactly (loads, casts to it, ops that
        # pick among such values, and every other half-typed elementwise result, rounded where it is made:
        # `round_output`). Others (a reduction's partial values) are fp32 values not yet rounded; a cast
        # from a half type rounds those first (`round_input`).
        self.exact: set[str] = set()

    # -- structure -----------------------------------------------------------------------------
    def _find_space(self) -> None:
        for n in self.nodes:
            for v in n.outputs:
                if v.type.dtype not in FUSIBLE_DTYPES:
                    raise NotExpressible(
                        nf.DTYPE, f"{n.name} produces {v.type.dtype.short}, which kernels do not compute in"
                    )
            if not (
                n.op in REDUCE_COMBINE
                or n.op in _ELEMENTWISE
                or n.op in _INDEX_OPS
                or n.op in ("full", "arange")
            ):
                raise NotExpressible(nf.NO_KERNEL_LOWERING, f"{n.name} ({n.op}) has no kernel lowering")
            problem = self.supports(n)
            if problem:
                raise NotExpressible(nf.NO_KERNEL_LOWERING, f"{n.name} ({n.op}): {problem}")
        for vid in self.input_ids:
            if self.types[vid].dtype not in FUSIBLE_DTYPES:
                raise NotExpressible(nf.DTYPE, f"input %{vid} is {self.types[vid].dtype.short}")
        self.reductions = [n for n in self.nodes if n.op in REDUCE_COMBINE]
        depth: dict[int, int] = {}
        for n in self.nodes:
            d = max((depth.get(i, 0) for i in n.inputs), default=0)
            if n.op in REDUCE_COMBINE:
                d += 1
            for v in n.outputs:
                depth[v.id] = d
        self.depth = depth
        self.max_depth = max((depth[n.out.id] for n in self.reductions), default=0)
        if self.reductions:
            first = self.reductions[0]
            full = self.types[first.inputs[0]].shape
            reduced = self._dims_of(first)
            for r in self.reductions:
                shape = self.types[r.inputs[0]].shape
                if shape != full or self._dims_of(r) != reduced:
                    raise NotExpressible(
                        nf.SPACES_DIFFER,
                        f"{r.name} reduces {shape} over {self._dims_of(r)}; the group reduces "
                        f"{full} over {reduced}",
                    )
            kept = tuple(d for d in range(len(full)) if d not in reduced)
            self.perm = kept + reduced
            self.space = tuple(full[d] for d in self.perm)
            self.n_outer = len(kept)
            self.full_shape = full
        else:
            shapes = {self.types[o].shape for o in self.output_ids}
            if len(shapes) != 1:
                raise NotExpressible(nf.SPACES_DIFFER, f"outputs have different shapes {sorted(shapes)}")
            self.space = shapes.pop()
            self.n_outer = len(self.space)
            self.perm = tuple(range(len(self.space)))
            self.full_shape = self.space
        self.pos = {d: k for k, d in enumerate(self.perm)}
        kept_set = set(self.perm[: self.n_outer])
        # A row output: the kept dims alone, or the input shape with its reduced dims kept as size 1.
        self.outer_shapes = {
            self.space[: self.n_outer],
            tuple(s if d in kept_set else 1 for d, s in enumerate(self.full_shape)),
        }
        self.full_outputs = list(self.output_ids)
        if self.reductions:
            self.full_outputs = [o for o in self.output_ids if self.types[o].shape == self.full_shape
                                 and self.types[o].shape not in self.outer_shapes]  # fmt: skip
            self.row_outputs = [o for o in self.output_ids if o not in self.full_outputs]
            for o in self.row_outputs:
                if self.types[o].shape not in self.outer_shapes:
                    raise NotExpressible(
                        nf.SPACES_DIFFER,
                        f"output %{o} of shape {self.types[o].shape} is neither the "
                        f"iteration space {self.full_shape} nor a row of it",
                    )
        else:
            self.row_outputs = []

    def _dims_of(self, r: Node) -> tuple[int, ...]:
        """The dims reduction `r` reduces, sorted (`_dim_set`)."""
        return tuple(sorted(_dim_set(r.attr("dims"), self.types[r.inputs[0]].rank)))

    def row_index(self, shape: tuple[int, ...]) -> tuple[Ix, ...]:
        """The per-row index of a value of a row shape (`outer_shapes`) in the kernel's loop dims."""
        if shape == self.space[: self.n_outer] and len(shape) != len(self.full_shape):
            return tuple(Ix.dim(k) for k in range(len(shape)))
        return tuple(
            Ix.dim(self.pos[d]) if self.pos[d] < self.n_outer else Ix.lit(0) for d in range(len(shape))
        )

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # -- views on inputs ------------------------------------------------------------------------
    def view_of(self, vid: int) -> _View | None:
        """The strided view a value is, when it is a kernel input or views applied to one."""
        if vid in self.buf_of:
            t = self.types[vid]
            return _View(self.buf_of[vid], t.shape, t.strides, 0)
        node = self.producer.get(vid)
        if node is None or node.op not in ("reshape", "permute", "expand", "slice", "select"):
            return None
        src = self.view_of(node.inputs[0])
        if src is None:
            return None
        a = node.attr_dict
        out_shape = node.out.type.shape
        if node.op == "permute":
            return _View(src.buf, out_shape, tuple(src.strides[d] for d in a["dims"]), src.offset)
        if node.op == "expand":
            lead = len(out_shape) - len(src.shape)
            strides = tuple(
                0 if k < lead or (src.shape[k - lead] == 1 and out_shape[k] != 1) else src.strides[k - lead]
                for k in range(len(out_shape))
            )
            return _View(src.buf, out_shape, strides, src.offset)
        if node.op == "slice":
            d = a["dim"]
            stepped = list(src.strides)
            stepped[d] *= a["step"]
            return _View(src.buf, out_shape, tuple(stepped), src.offset + a["start"] * src.strides[d])
        if node.op == "select":
            d = a["dim"]
            return _View(
                src.buf,
                out_shape,
                src.strides[:d] + src.strides[d + 1 :],
                src.offset + a["index"] * src.strides[d],
            )
        reshaped = reshape_strides(src.shape, src.strides, out_shape)
        return None if reshaped is None else _View(src.buf, out_shape, reshaped, src.offset)

    # -- emission -------------------------------------------------------------------------------
    def stage_list(self, stage: int) -> list[Stmt]:
        return self.post if stage < 0 else self.stages[stage]

    def emit(self, vid: int, index: tuple[Ix, ...], stage: int) -> str:
        """C++ variable holding value `vid` at `index`, computed in `stage` (-1: per row, after the loops)."""
        ikey = tuple(i.key() for i in index)
        key = (vid, ikey, stage)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        var = self._carried(vid, ikey, stage)
        if var is None:
            var = self._emit(vid, index, stage)
            made = self.stage_list(stage)
            if made and made[-1].var == var:
                self.kinds[var] = made[-1].kind
        self.memo[key] = var
        return var

    def _carried(self, vid: int, ikey: tuple[Any, ...], stage: int) -> str | None:
        """A value an earlier stage computed at this same row position, kept in a per-thread row
        buffer instead of recomputed (softmax's exp, layer_norm's x - mean): persistent rows."""
        if stage <= 0 or ikey != self.full_key or self.inner_numel > self.max_carried_row:
            return None
        for earlier in range(stage):
            var = self.memo.get((vid, ikey, earlier))
            if var is None or self.kinds.get(var) is not StmtKind.COMPUTE or var in self.cheap:
                continue
            name = self.row_buffers.get(vid)
            if name is None:
                name = f"rb{len(self.row_buffers)}"
                self.row_buffers[vid] = name
                self.stages[earlier].append(
                    Stmt(StmtKind.ROWSTORE, var, self.types[vid].dtype, offset=self.row_offset, value=name)
                )
            out = self.fresh()
            self.stages[stage].append(
                Stmt(StmtKind.ROWLOAD, out, self.types[vid].dtype, offset=self.row_offset, value=name)
            )
            return out
        return None

    def _check_row_index(self, index: tuple[Ix, ...], stage: int, what: str) -> None:
        inner = set(range(self.n_outer, len(self.space)))
        if stage < 0 and any(ix.dims & inner for ix in index):
            raise NotExpressible(
                nf.SPACES_DIFFER, f"{what} is needed per row but varies along the reduced dims"
            )

    def _emit(self, vid: int, index: tuple[Ix, ...], stage: int) -> str:
        t = self.types[vid]
        out = self.stage_list(stage)
        view = self.view_of(vid)
        if view is not None:
            self._check_row_index(index, stage, f"input %{vid}")
            var = self.fresh()
            out.append(
                Stmt(
                    StmtKind.LOAD,
                    var,
                    t.dtype,
                    buf=view.buf,
                    offset=offset_of(index, view.strides, view.offset),
                )
            )
            self.exact.add(var)
            return var
        node = self.producer.get(vid)
        if node is None:
            raise NotExpressible(
                nf.NO_OUTPUTS, f"value %{vid} is neither produced in the group nor one of its inputs"
            )
        op, a = node.op, node.attr_dict
        if op in REDUCE_COMBINE:
            return self._reduction(node, index)
        if op == "full":
            var = self.fresh()
            out.append(Stmt(StmtKind.LITERAL, var, t.dtype, value=a["value"]))
            self.invariant.add(var)
            return var
        if op == "arange":
            var = self.fresh()
            out.append(
                Stmt(
                    StmtKind.INDEX,
                    var,
                    t.dtype,
                    offset=index[0].scale(1),
                    attrs={"start": a["start"], "step": a["step"]},
                )
            )
            return var
        if op in _ELEMENTWISE:
            args = tuple(
                self.emit(i, broadcast_index(index, t.shape, self.types[i].shape), stage) for i in node.inputs
            )
            var = self.fresh()
            attrs = {k: v for k, v in a.items()}
            attrs["in_dtype"] = self.types[node.inputs[-1]].dtype
            if (
                op == "div"
                and t.dtype.is_float
                and not a.get("rounding_mode")
                and args[1] in self.invariant
                and self._reciprocal_is_safe(node.inputs[1])
            ):
                attrs["by_reciprocal"] = True  # the renderer multiplies by a hoisted 1/s
            if op == "cast" and self.types[node.inputs[0]].dtype in HALF and args[0] not in self.exact:
                attrs["round_input"] = True  # a half value computed in fp32: round it before it is converted
            picks = op in _KEEPS_HALF and all(x in self.exact for x in args[-2:])
            if t.dtype in HALF and op != "cast" and not picks:
                # every half-typed result is rounded to its type where it is made, as eager does after each
                # op: else one consumer of x would see it rounded (through a cast) and another unrounded,
                # and x16 - x16.mean(size-1 dim) would not be 0
                attrs["round_output"] = True
            if t.dtype in HALF or picks:
                self.exact.add(var)
            if op == "pow" and t.dtype.is_float:
                e = self._literal_exponent(node.inputs[1])
                if e is not None:
                    attrs["exponent"] = e  # the renderer multiplies for small (half-)integers
            if op == "exp" and t.dtype.is_float and self._nonpositive(node.inputs[0]):
                attrs["nonpositive"] = True  # the renderer uses the cheaper af_exp_nonpos
            out.append(Stmt(StmtKind.COMPUTE, var, t.dtype, op=op, args=args, attrs=attrs))
            if all(x in self.invariant for x in args):
                self.invariant.add(var)
            if op in _CHEAP and all(self._recomputable(x) for x in args):
                ops = 1 + sum(self.cheap.get(x, 0) for x in args)
                if ops <= _CHEAP_OPS:
                    self.cheap[var] = ops
            return var
        return _INDEX_OPS[op](self, node, index, stage)

    def _recomputable(self, var: str) -> bool:
        made_by = self.kinds.get(var)
        return made_by in (StmtKind.LOAD, StmtKind.LITERAL) or var in self.invariant or var in self.cheap

    def _reciprocal_is_safe(self, vid: int) -> bool:
        """The one place that decides whether x / s may become x * (1/s) (s fixed per row or a literal).

        In general it may not: 1/s overflows for a subnormal s (x / s is finite) and x * (1/s) rounds twice.
        It may when s is a literal power of two whose reciprocal is normal too: then 1/s is exact and the
        multiply is bit-identical to the division for every x. And for softmax's row sum
        s = sum(exp(x - amax(x))) over the same dims: s is NaN or in [1, n] (one term is exp(0) = 1 and
        the others are >= 0), so 1/s is normal and the multiply is within an ulp of the division, which
        is what torch's own softmax kernel does."""
        node = self.producer.get(vid)
        if node is None:
            return False
        if node.op == "full":
            return exact_reciprocal(node.attr("value"), node.out.type.dtype) is not None
        if node.op != "sum" or not node.attr_dict.get("keepdim"):
            return False
        ex = self.producer.get(node.inputs[0])
        if ex is None or ex.op != "exp" or not self._nonpositive(ex.inputs[0]):
            return False
        mx = self.producer[self.producer[ex.inputs[0]].inputs[1]]
        rank = self.types[node.inputs[0]].rank
        return _dim_set(node.attr("dims"), rank) == _dim_set(mx.attr("dims"), rank)

    def _literal_exponent(self, vid: int) -> float | None:
        """The exponent of x ** e when it is a literal (a `full`), as a Python float, else None."""
        node = self.producer.get(vid)
        if node is None or node.op != "full":
            return None
        v = node.attr("value")
        return None if isinstance(v, bool) or not isinstance(v, (int, float)) else float(v)

    def _nonpositive(self, vid: int) -> bool:
        """True when value `vid` is x - amax(x) over some dims with keepdim (softmax's shift), computed in
        this group: every element is <= 0 or NaN, because float subtraction of a <= b rounds to <= 0."""
        sub = self.producer.get(vid)
        if sub is None or sub.op != "sub":
            return False
        x, m = sub.inputs
        mx = self.producer.get(m)
        return (
            mx is not None
            and mx.op == "amax"
            and mx.inputs[0] == x
            and bool(mx.attr_dict.get("keepdim"))
            and self.types[x].dtype == self.types[m].dtype
            and self.types[x].dtype.is_float
        )

    def _reduction(self, node: Node, index: tuple[Ix, ...]) -> str:
        shape = self.types[node.out.id].shape
        for k, (ix, want) in enumerate(zip(index, self.row_index(shape), strict=True)):
            if ix.key() != want.key() and not (shape[k] == 1 and ix.key() == Ix.lit(0).key()):
                raise NotExpressible(
                    nf.SPACES_DIFFER,
                    f"{node.name} is used at index {[i.render() for i in index]}, not per row",
                )
        return self._ensure_acc(node).var

    def _ensure_acc(self, node: Node) -> Accumulator:
        acc = self.accs.get(node.out.id)
        if acc is None:
            stage = self.depth[node.out.id] - 1
            arg = self.emit(node.inputs[0], self.full_index, stage)
            acc = Accumulator(self.fresh("acc"), node.op, node.out.type.dtype, stage)
            self.invariant.add(acc.var)
            self.accs[node.out.id] = acc
            self.stages[stage].append(Stmt(StmtKind.ACC, acc.var, acc.dtype, op=node.op, args=(arg,)))
        return acc

    def lower(self) -> LoopKernel:
        # Reductions first, in stage order, so a later stage finds what an earlier one computed
        # (and carries it in a row buffer) instead of emitting it afresh before the earlier stage.
        for r in sorted(self.reductions, key=lambda n: self.depth[n.out.id]):
            self._ensure_acc(r)
        full = self.full_index
        final = len(self.stages) - 1
        for o in self.full_outputs:
            b = len(self.input_ids) + self.output_ids.index(o)
            var = self.emit(o, full, final)
            self.stages[final].append(
                Stmt(
                    StmtKind.STORE,
                    var,
                    self.types[o].dtype,
                    buf=b,
                    offset=offset_of(full, self.buffers[b].type.strides, 0),
                )
            )
        for o in self.row_outputs:
            b = len(self.input_ids) + self.output_ids.index(o)
            shape = self.types[o].shape
            index = self.row_index(shape)
            var = self.emit(o, index, -1)
            self.post.append(
                Stmt(
                    StmtKind.STORE,
                    var,
                    self.types[o].dtype,
                    buf=b,
                    offset=offset_of(index, self.buffers[b].type.strides, 0),
                )
            )
        accs = sorted(self.accs.values(), key=lambda a: a.stage)
        rbs = tuple((name, self.types[v].dtype) for v, name in self.row_buffers.items())
        stages = tuple(tuple(st) for st in self.stages)
        perm = self.perm if self.perm != tuple(range(len(self.perm))) else ()
        return LoopKernel(self.name, self.space, self.n_outer, tuple(self.buffers), stages, tuple(accs),
                          tuple(self.pre), tuple(self.post), self.nodes, rbs, perm)  # fmt: skip


# ---- index-mapping ops on computed values ---------------------------------------------------------


def _permute(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    dims = node.attr("dims")
    src = [Ix.lit(0)] * len(dims)
    for k, d in enumerate(dims):
        src[d] = index[k]
    return lw.emit(node.inputs[0], tuple(src), stage)


def _expand(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    src = lw.types[node.inputs[0]].shape
    return lw.emit(node.inputs[0], broadcast_index(index, node.out.type.shape, src), stage)


def _slice(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    a = node.attr_dict
    src = list(index)
    src[a["dim"]] = index[a["dim"]].scale(a["step"]) + a["start"]
    return lw.emit(node.inputs[0], tuple(src), stage)


def _select(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    d = node.attr("dim")
    return lw.emit(node.inputs[0], (*index[:d], Ix.lit(node.attr("index")), *index[d:]), stage)


def _flip(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    shape = node.out.type.shape
    src = list(index)
    for d in node.attr("dims"):
        src[d] = index[d].scale(-1) + (shape[d] - 1)
    return lw.emit(node.inputs[0], tuple(src), stage)


def _reshape(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    """Pull through a reshape of a computed value: splits and size-1 changes are affine; merges are not."""
    src_shape = lw.types[node.inputs[0]].shape
    dst_shape = node.out.type.shape
    src_idx = [i for i, s in enumerate(src_shape) if s != 1]
    dst_idx = [i for i, s in enumerate(dst_shape) if s != 1]
    src = [Ix.lit(0)] * len(src_shape)
    si = di = 0
    while si < len(src_idx):
        # One source dim maps to one or more destination dims (a split); anything else is a merge.
        size = src_shape[src_idx[si]]
        acc, group = 1, []
        while acc < size and di < len(dst_idx):
            acc *= dst_shape[dst_idx[di]]
            group.append(dst_idx[di])
            di += 1
        if acc != size:
            raise NotExpressible(
                nf.MERGING_RESHAPE, f"{node.name} merges dims of a computed value {src_shape} -> {dst_shape}"
            )
        ix, stride = Ix.lit(0), 1
        for d in reversed(group):
            ix = ix + index[d].scale(stride)
            stride *= dst_shape[d]
        src[src_idx[si]] = ix
        si += 1
    return lw.emit(node.inputs[0], tuple(src), stage)


def _clamped(ix: Ix, lo: int, hi: int) -> Ix:
    text = f"std::min<int64_t>(std::max<int64_t>({ix.render()}, {lo}), {hi})"
    return Ix.opaque(text, ix.dims)


def _concat(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    d = node.attr("dim")
    out = lw.stage_list(stage)
    pos = lw.fresh("p")
    out.append(Stmt(StmtKind.INDEX, pos, DType.int64, offset=index[d], attrs={"start": 0, "step": 1}))
    start, parts = 0, []
    for i in node.inputs:
        size = lw.types[i].shape[d]
        if size:
            sub = list(index)
            sub[d] = _clamped(index[d] + (-start), 0, size - 1)
            parts.append((start + size, lw.emit(i, tuple(sub), stage)))
        start += size
    var = parts[-1][1]
    for end, part in reversed(parts[:-1]):
        lim, cond, sel = lw.fresh("c"), lw.fresh("c"), lw.fresh()
        out.append(Stmt(StmtKind.LITERAL, lim, DType.int64, value=end))
        out.append(
            Stmt(
                StmtKind.COMPUTE, cond, DType.bool, op="lt", args=(pos, lim), attrs={"in_dtype": DType.int64}
            )
        )
        out.append(
            Stmt(
                StmtKind.COMPUTE,
                sel,
                node.out.type.dtype,
                op="where",
                args=(cond, part, var),
                attrs={"in_dtype": node.out.type.dtype},
            )
        )
        var = sel
    return var


def _pad(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    pads = node.attr("pads")
    src_t = lw.types[node.inputs[0]]
    out = lw.stage_list(stage)
    sub = list(index)
    inside: str | None = None
    for k in range(len(pads) // 2):
        d = src_t.rank - 1 - k
        lo = pads[2 * k]
        shifted = index[d] + (-lo)
        sub[d] = _clamped(shifted, 0, max(src_t.shape[d] - 1, 0))
        pos, lim0, lim1, c0, c1, both = (
            lw.fresh("p"),
            lw.fresh("c"),
            lw.fresh("c"),
            lw.fresh("c"),
            lw.fresh("c"),
            lw.fresh("c"),
        )
        out.append(Stmt(StmtKind.INDEX, pos, DType.int64, offset=shifted, attrs={"start": 0, "step": 1}))
        out.append(Stmt(StmtKind.LITERAL, lim0, DType.int64, value=0))
        out.append(Stmt(StmtKind.LITERAL, lim1, DType.int64, value=src_t.shape[d]))
        out.append(
            Stmt(StmtKind.COMPUTE, c0, DType.bool, op="ge", args=(pos, lim0), attrs={"in_dtype": DType.int64})
        )
        out.append(
            Stmt(StmtKind.COMPUTE, c1, DType.bool, op="lt", args=(pos, lim1), attrs={"in_dtype": DType.int64})
        )
        out.append(
            Stmt(
                StmtKind.COMPUTE,
                both,
                DType.bool,
                op="logical_and",
                args=(c0, c1),
                attrs={"in_dtype": DType.bool},
            )
        )
        if inside is not None:
            merged = lw.fresh("c")
            out.append(
                Stmt(
                    StmtKind.COMPUTE,
                    merged,
                    DType.bool,
                    op="logical_and",
                    args=(inside, both),
                    attrs={"in_dtype": DType.bool},
                )
            )
            both = merged
        inside = both
    value = lw.emit(node.inputs[0], tuple(sub), stage)
    if inside is None:
        return value
    fill, var = lw.fresh(), lw.fresh()
    dtype = node.out.type.dtype
    out.append(Stmt(StmtKind.LITERAL, fill, dtype, value=node.attr("value")))
    out.append(
        Stmt(StmtKind.COMPUTE, var, dtype, op="where", args=(inside, value, fill), attrs={"in_dtype": dtype})
    )
    return var


def _gather_like(lw: _Lowerer, node: Node, index: tuple[Ix, ...], stage: int) -> str:
    d = node.attr("dim")
    x, idx = node.inputs
    where = (index[d],) if node.op == "index_select" else index
    pos = lw.emit(idx, where if node.op == "gather" else (index[d],), stage)
    size = lw.types[x].shape[d]
    sub = list(index)
    # Indices outside [0, size) are an error in torch; the clamp keeps the load in bounds instead of crashing.
    wrapped = f"(int64_t)({pos}) + ((int64_t)({pos}) < 0 ? {size} : 0)"
    sub[d] = Ix.opaque(
        f"std::min<int64_t>(std::max<int64_t>({wrapped}, 0), {size - 1})",
        frozenset().union(*(i.dims for i in where)),
    )
    return lw.emit(x, tuple(sub), stage)


_INDEX_OPS = {
    "permute": _permute, "expand": _expand, "slice": _slice, "select": _select, "flip": _flip,
    "reshape": _reshape, "concat": _concat, "pad": _pad, "index_select": _gather_like, "gather": _gather_like,
}  # fmt: skip


def lower_group(name: str, nodes: Sequence[Node], inputs: Sequence[int], outputs: Sequence[int],
                types: dict[int, TensorType], supports: Callable[[Node], str | None] = lambda n: None,
                max_carried_row: int = MAX_CARRIED_ROW) -> LoopKernel:  # fmt: skip
    """Lower one fused group; raises NotExpressible with an NF code when it cannot be one kernel.

    `supports(node)` is the backend's say: None when it can generate the node, else why not.
    `max_carried_row`: longest reduction row (elements) whose values may be carried between stages
    in row buffers; the planner derives it from the profile's on-chip budget (persistent rows)."""
    if not outputs:
        raise NotExpressible(nf.NO_OUTPUTS, "the group has no outputs")
    return _Lowerer(name, nodes, inputs, outputs, types, supports, max_carried_row).lower()
