"""The reference runtime: an IR interpreter built on eager torch ops.

In: a `Graph` and one torch tensor per graph input. Out: one tensor per graph output.

It is the ground truth for tests and the path any kernel falls back to, so each op's implementation
here is the plainest torch call with the op's documented semantics. Values are dropped after their
last use (as torch.fx.Interpreter does) so peak memory stays close to eager's. A failure is raised as
`ExecutionError` naming the node, its op and the user's source line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from autofusion.errors import ExecutionError
from autofusion.ir import catalog, unsigned
from autofusion.ir.graph import Arg, Graph, Node
from autofusion.ir.printer import format_node

log = logging.getLogger(__name__)

Impl = Callable[[Node, list[torch.Tensor], Graph], Any]
IMPLS: dict[str, Impl] = {}


def impl(*names: str) -> Callable[[Impl], Impl]:
    def deco(fn: Impl) -> Impl:
        for n in names:
            if n in IMPLS:
                raise ValueError(f"reference impl for {n} registered twice")
            IMPLS[n] = fn
        return fn

    return deco


# ---- elementwise -------------------------------------------------------------------------------

_TORCH_NAMED = (
    (set(catalog.FLOAT_UNARY) - {"silu", "hardsigmoid", "hardswish", "mish"})
    | set(catalog.ANY_UNARY)
    | set(catalog.PREDICATE_UNARY)
    | {"bitwise_not"}
    | set(catalog.BINARY) - {"div"}
)
for _name in sorted(_TORCH_NAMED):
    IMPLS[_name] = (lambda fn: lambda n, xs, g: fn(*xs))(getattr(torch, _name))
for _name in ("silu", "hardsigmoid", "hardswish", "mish"):
    IMPLS[_name] = (lambda fn: lambda n, xs, g: fn(*xs))(getattr(F, _name))


@impl("div")
def _div(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.div(xs[0], xs[1], rounding_mode=n.attr("rounding_mode"))


@impl("gelu")
def _gelu(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return F.gelu(xs[0], approximate=n.attr("approximate"))


@impl("leaky_relu")
def _leaky_relu(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return F.leaky_relu(xs[0], n.attr("negative_slope"))


@impl("elu")
def _elu(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.ops.aten.elu(xs[0], n.attr("alpha"), n.attr("scale"), n.attr("input_scale"))


@impl("softplus")
def _softplus(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return F.softplus(xs[0], n.attr("beta"), n.attr("threshold"))


@impl("clamp")
def _clamp(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.clamp(xs[0], n.attr("min"), n.attr("max"))


@impl("cast")
def _cast(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return xs[0].to(n.attr("dtype").to_torch())


@impl("where")
def _where(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.where(xs[0], xs[1], xs[2])


@impl("lerp")
def _lerp(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.lerp(*torch.broadcast_tensors(*xs))


# ---- sources -----------------------------------------------------------------------------------


@impl("full")
def _full(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.full(n.attr("shape"), n.attr("value"), dtype=n.attr("dtype").to_torch())


@impl("arange")
def _arange(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.arange(n.attr("start"), n.attr("end"), n.attr("step"), dtype=n.attr("dtype").to_torch())


@impl("const")
def _const(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return g.constants[n.attr("name")]


# ---- injective ---------------------------------------------------------------------------------


@impl("reshape")
def _reshape(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return xs[0].reshape(n.attr("shape"))


@impl("permute")
def _permute(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return xs[0].permute(n.attr("dims"))


@impl("expand")
def _expand(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return xs[0].expand(n.attr("shape"))


@impl("slice")
def _slice(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    a = n.attr_dict
    return torch.ops.aten.slice.Tensor(xs[0], a["dim"], a["start"], a["end"], a["step"])


@impl("select")
def _select(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return xs[0].select(n.attr("dim"), n.attr("index"))


@impl("concat")
def _concat(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.cat(xs, n.attr("dim"))


@impl("pad")
def _pad(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return F.pad(xs[0], n.attr("pads"), value=n.attr("value"))


@impl("index_select")
def _index_select(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.index_select(xs[0], n.attr("dim"), xs[1])


@impl("gather")
def _gather(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.gather(xs[0], n.attr("dim"), xs[1])


@impl("flip")
def _flip(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.flip(xs[0], n.attr("dims"))


# ---- reductions and normalisations ----------------------------------------------------------------


def _dims(n: Node, x: torch.Tensor) -> tuple[int, ...]:
    return tuple(n.attr("dims")) or tuple(range(x.dim()))


@impl("sum", "mean", "amax", "amin", "any", "all")
def _reduce(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    x = xs[0]
    if n.op in ("amax", "amin") and x.numel() == 0:
        # torch refuses a max over nothing; decompositions (softmax of an empty row) need the
        # identity a generated kernel starts from: -inf / +inf (an integer type's min / max).
        return _empty_extremum(n, x)
    fn = getattr(torch, n.op)
    out = fn(x) if x.dim() == 0 else fn(x, dim=_dims(n, x), keepdim=n.attr("keepdim"))
    # torch.sum of bool/int promotes to int64; the IR keeps the input dtype (casts are explicit),
    # except any/all, which always give bool.
    return out if n.op in ("any", "all") else out.to(x.dtype)


def _empty_extremum(n: Node, x: torch.Tensor) -> torch.Tensor:
    shape = n.out.type.shape
    if x.dtype.is_floating_point:
        value = -math.inf if n.op == "amax" else math.inf
    elif x.dtype is torch.bool:
        value = n.op != "amax"
    else:
        info = torch.iinfo(x.dtype)
        value = info.min if n.op == "amax" else info.max
    return torch.full(shape, value, dtype=x.dtype)


@impl("prod")
def _prod(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    # torch.prod takes one dim: the reduced dims are moved last and flattened into one, so the
    # product accumulates once and rounds once. Half types accumulate in fp32, as generated kernels
    # do and as torch does for every other half reduction (torch's fp16 prod rounds each step to fp16:
    # 1.001 ** 3000 gives 17.56 there, 18.69 here and in float64).
    x = xs[0]
    if x.dim() == 0:
        return x.clone()
    src = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    dims = sorted({d % x.dim() for d in _dims(n, x)})
    keep = [d for d in range(x.dim()) if d not in dims]
    flat = src.permute(*keep, *dims).reshape(*(x.shape[d] for d in keep), math.prod(x.shape[d] for d in dims))
    out = torch.prod(flat, dim=-1)
    if n.attr("keepdim"):
        out = out.reshape(tuple(1 if d in dims else x.shape[d] for d in range(x.dim())))
    return out.to(x.dtype)


@impl("var")
def _var(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    x = xs[0]
    return torch.var(x, dim=_dims(n, x), correction=n.attr("correction"), keepdim=n.attr("keepdim"))


@impl("argmax", "argmin")
def _argreduce(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    # torch's argmax has no bool kernel (max.dim has, and is converted to amax + argmax): False < True
    # as 0 < 1, with the same first index on ties.
    x = xs[0].to(torch.uint8) if xs[0].dtype is torch.bool else xs[0]
    return getattr(torch, n.op)(x, dim=n.attr("dim"), keepdim=n.attr("keepdim"))


@impl("softmax")
def _softmax(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.softmax(xs[0], n.attr("dim"))


@impl("log_softmax")
def _log_softmax(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.log_softmax(xs[0], n.attr("dim"))


def _optional(xs: list[torch.Tensor], flags: Sequence[bool]) -> list[torch.Tensor | None]:
    it = iter(xs)
    return [next(it) if f else None for f in flags]


@impl("layer_norm")
def _layer_norm(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    x = xs[0]
    w, b = _optional(xs[1:], (n.attr("has_weight"), n.attr("has_bias")))
    return F.layer_norm(x, x.shape[x.dim() - n.attr("normalized_ndim") :], w, b, n.attr("eps"))


@impl("rms_norm")
def _rms_norm(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    x = xs[0]
    (w,) = _optional(xs[1:], (n.attr("has_weight"),))
    return F.rms_norm(x, x.shape[x.dim() - n.attr("normalized_ndim") :], w, n.attr("eps"))


@impl("batch_norm")
def _batch_norm(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    w, b = _optional(xs[3:], (n.attr("has_weight"), n.attr("has_bias")))
    return F.batch_norm(xs[0], xs[1], xs[2], w, b, training=False, eps=n.attr("eps"))


# ---- anchors -----------------------------------------------------------------------------------


@impl("mm")
def _mm(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.mm(xs[0], xs[1])


@impl("bmm")
def _bmm(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.bmm(xs[0], xs[1])


@impl("addmm")
def _addmm(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return torch.addmm(xs[0], xs[1], xs[2], beta=n.attr("beta"), alpha=n.attr("alpha"))


@impl("linear")
def _linear(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    return F.linear(xs[0], xs[1], xs[2] if n.attr("has_bias") else None)


@impl("conv")
def _conv(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    a = n.attr_dict
    bias = xs[2] if a["has_bias"] else None
    x, w = xs[0], xs[1]
    if a["channels_last"]:
        # The result is NHWC-strided; consumers that index NCHW (fused kernels) make it contiguous.
        x, w = (
            x.contiguous(memory_format=torch.channels_last),
            w.contiguous(memory_format=torch.channels_last),
        )
    return torch.convolution(
        x, w, bias, list(a["stride"]), list(a["padding"]), list(a["dilation"]),
        a["transposed"], list(a["output_padding"]), a["groups"],
    )  # fmt: skip


@impl("sdpa")
def _sdpa(n: Node, xs: list[torch.Tensor], g: Graph) -> torch.Tensor:
    mask = xs[3] if n.attr("has_mask") else None
    return F.scaled_dot_product_attention(
        xs[0], xs[1], xs[2], attn_mask=mask, is_causal=n.attr("is_causal"), scale=n.attr("scale")
    )


# ---- extern ------------------------------------------------------------------------------------


# Extern targets with a Python implementation registered here run it directly: the same function the
# torch.library operator of that name wraps, without ~30 us of dispatcher-to-Python cost per call.
PY_TARGETS: dict[str, Callable[..., Any]] = {}


def resolve_target(target: str) -> Any:
    """ "aten.sort.stable" -> torch.ops.aten.sort.stable."""
    fast = PY_TARGETS.get(target)
    if fast is not None:
        return fast
    obj: Any = torch.ops
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def fill_template(template: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(template, Arg):
        return tensors[template.index]
    if isinstance(template, tuple):
        return type(template)(fill_template(t, tensors) for t in template)
    return template


@impl("extern")
def _extern(n: Node, xs: list[torch.Tensor], g: Graph) -> Any:
    fn = resolve_target(n.attr("target"))
    args = fill_template(n.attr("args"), xs)
    kwargs = {k: fill_template(v, xs) for k, v in n.attr("kwargs")}
    out = fn(*args, **kwargs)
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return tuple(leaves)


# ---- the interpreter ---------------------------------------------------------------------------


def last_uses(graph: Graph) -> list[list[int]]:
    """For each node index, the value ids whose last use is that node (graph outputs never die)."""
    last: dict[int, int] = {}
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            last[i] = k
    keep = set(graph.outputs)
    dead: list[list[int]] = [[] for _ in graph.nodes]
    for vid, k in last.items():
        if vid not in keep:
            dead[k].append(vid)
    return dead


def run_node(node: Node, args: list[torch.Tensor], graph: Graph) -> tuple[torch.Tensor, ...]:
    try:
        if unsigned.involved(node, args):
            out = unsigned.run(node, args, graph, IMPLS[node.op])  # torch lacks most uint16/32/64 kernels
        else:
            out = IMPLS[node.op](node, args, graph)
    except Exception as e:  # re-raised with the node named
        where = f" (from {node.loc})" if node.loc else ""
        arg_desc = ", ".join(f"{tuple(a.shape)}:{str(a.dtype).removeprefix('torch.')}" for a in args)
        raise ExecutionError(
            f"while executing node {node.name!r}{where}:\n  {format_node_plain(node)}\n"
            f"  with inputs ({arg_desc})\n  {type(e).__name__}: {e}"
        ) from e
    return out if isinstance(out, tuple) else (out,)


def format_node_plain(node: Node) -> str:
    from autofusion.ir.printer import _Names

    names = _Names()
    for i in node.inputs:
        names.define(i)
    return format_node(node, names)


def run_graph(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    if len(inputs) != len(graph.inputs):
        raise ExecutionError(f"graph {graph.name} takes {len(graph.inputs)} inputs, got {len(inputs)}")
    env: dict[int, torch.Tensor] = {gi.value.id: t for gi, t in zip(graph.inputs, inputs, strict=True)}
    dead = last_uses(graph)
    with torch.no_grad():
        for k, node in enumerate(graph.nodes):
            outs = run_node(node, [env[i] for i in node.inputs], graph)
            for v, t in zip(node.outputs, outs, strict=True):
                env[v.id] = t
            for vid in dead[k]:
                del env[vid]
    return [env[o] for o in graph.outputs]


def random_inputs(graph: Graph, seed: int = 0) -> list[torch.Tensor]:
    """One reproducible set of inputs for `graph`, for comparing two programs or graphs on the same
    values: floats normal, bools fair coins, other integers 0 or 1 (valid as indices and sizes)."""
    gen = torch.Generator().manual_seed(seed)
    xs = []
    for gi in graph.inputs:
        t = gi.value.type
        dt = t.dtype.to_torch()
        if dt.is_floating_point:
            xs.append(torch.randn(t.shape, generator=gen).to(dt))
        elif dt == torch.bool:
            xs.append(torch.rand(t.shape, generator=gen) > 0.5)
        else:
            xs.append(torch.randint(0, 2, t.shape, generator=gen).to(dt))
    return xs
