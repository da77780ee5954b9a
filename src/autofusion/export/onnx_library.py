"""Fusion-rule library calls (`extern` nodes targeting `autofusion_rules.<name>.default`) as standard ONNX.

The rules in `autofusion.passes.rewrite.library` replace matched windows with calls to torch operators that
onnxruntime does not know. Here each one is spelled out with opset-18 ops that compute exactly what
the torch implementation computes, so `export_graph` gives a model onnxruntime runs:

- `conv_bn_act`: the BatchNorm fold computed in the graph from the weights it is given (in fp32, as
  the library folds, cast back to the weight dtype), then Conv + optional residual Add + activation.
  Computing the fold in the graph keeps weights that are graph inputs (an unbound parameter) right;
  with weights as initializers onnxruntime folds those nodes into constants when it loads the model.
- `linear_act` / `linear_residual`: an optional LayerNorm-affine fold (W' = W * gamma,
  b' = b + W @ beta), then Gemm (rank-2 input) or MatMul + Add, then the activation or the residual.

The IR's `sdpa` op (what the attention rules produce) is an ordinary IR op with its own emitter in
`onnx_ops`. A new library implementation needs one function here, registered with `@expands(name)`;
an extern without an expansion keeps the exporter's ATen-domain fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from onnx import TensorProto

from autofusion.errors import ExportError
from autofusion.export.onnx_math import gelu
from autofusion.export.onnx_math import scalar as _scalar
from autofusion.export.writer import Sink
from autofusion.export.writer import elem_type as onnx_type
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Node
from autofusion.passes.rewrite.library import NAMESPACE

Expansion = Callable[[Sink, Node, list[str], list[str]], None]
EXPANSIONS: dict[str, Expansion] = {}


def expands(name: str) -> Callable[[Expansion], Expansion]:
    """Register the ONNX expansion of library implementation `name` (`autofusion_rules.<name>.default`)."""

    def deco(fn: Expansion) -> Expansion:
        EXPANSIONS[f"{NAMESPACE}.{name}.default"] = fn
        return fn

    return deco


class _Call:
    """An extern's argument template read back: tensor slots as ONNX names (None when absent) and literals."""

    def __init__(self, s: Sink, n: Node, ins: list[str], n_tensors: int, n_literals: int) -> None:
        args = tuple(n.attr("args") or ())
        if len(args) != n_tensors + n_literals or any(
            a is not None and not isinstance(a, Arg) for a in args[:n_tensors]
        ):
            raise ExportError(
                f"node {n.name!r} ({n.attr('target')}): expected {n_tensors} tensor and {n_literals} literal "
                f"arguments, got {args!r}"
            )
        self.names: list[str | None] = [None if a is None else ins[a.index] for a in args[:n_tensors]]
        self.dtypes: list[DType | None] = [
            None if a is None else s.types[n.inputs[a.index]].dtype for a in args[:n_tensors]
        ]
        self.ranks: list[int | None] = [
            None if a is None else s.types[n.inputs[a.index]].rank for a in args[:n_tensors]
        ]
        self.literals: tuple[Any, ...] = args[n_tensors:]


def _to_f32(s: Sink, x: str, dt: DType) -> str:
    return x if dt is DType.float32 else s.node("Cast", [x], to=TensorProto.FLOAT)


def _from_f32(s: Sink, x: str, dt: DType) -> str:
    return x if dt is DType.float32 else s.node("Cast", [x], to=onnx_type(dt))


def _activation(s: Sink, y: str, act: str, dt: DType, out: list[str]) -> None:
    """`out` = act(y), with the activations `rules.library._act_torch` knows."""
    if act == "none":
        s.node("Identity", [y], out)
    elif act == "relu":
        s.node("Relu", [y], out)
    elif act == "relu6":
        s.node("Clip", [y, _scalar(s, 0.0, dt), _scalar(s, 6.0, dt)], out)
    elif act == "silu":
        s.node("Mul", [y, s.node("Sigmoid", [y])], out)
    elif act in ("gelu", "gelu_tanh"):
        gelu(s, y, dt, act == "gelu_tanh", out)
    else:
        raise ExportError(f"activation {act!r} has no ONNX expansion")


def _bn_folded(s: Sink, f32: Callable[[int], str | None], eps: float, wdt: DType,
               wrank: int) -> tuple[str, str]:  # fmt: skip
    """The BatchNorm folded into the convolution's weight and bias, computed in the graph (fp32)."""
    f = DType.float32
    # scale = gamma / sqrt(var + eps); shift = (b - mean) * scale + beta  (fp32, like the library's fold)
    v32 = f32(4)
    assert v32 is not None
    scale = s.node("Reciprocal", [s.node("Sqrt", [s.node("Add", [v32, _scalar(s, eps, f)])])])
    g32 = f32(5)
    if g32 is not None:
        scale = s.node("Mul", [scale, g32])
    m32 = f32(3)
    assert m32 is not None
    b32 = f32(2)
    centred = s.node("Neg", [m32]) if b32 is None else s.node("Sub", [b32, m32])
    shift = s.node("Mul", [centred, scale])
    be32 = f32(6)
    if be32 is not None:
        shift = s.node("Add", [shift, be32])
    per_channel = s.node("Reshape", [scale, s.ints([-1] + [1] * (wrank - 1))])
    w32 = f32(1)
    assert w32 is not None
    return _from_f32(s, s.node("Mul", [w32, per_channel]), wdt), _from_f32(s, shift, wdt)


@expands("conv_bn_act")
def _conv_bn_act(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    # conv_bn_act(x, w, b?, mean?, var?, gamma?, beta?, other?, eps, stride, padding, dilation, groups, act
    #             [, route, channels_last [, pre_pad]]): the route and the result's memory layout do not
    # change values; `pre_pad` (F.pad's order: w before/after, h before/after) joins Conv's own pads,
    # which may differ per side.
    n_args = len(tuple(n.attr("args") or ()))
    c = _Call(s, n, i, 8, n_args - 8 if n_args in (14, 16, 17) else 6)  # (_Call rejects other counts)
    x, w, _b, mean, var, _gamma, _beta, other = c.names
    eps, stride, padding, dilation, groups, act = c.literals[:6]
    pre = tuple(c.literals[8] or ()) if len(c.literals) > 8 else ()
    begin, end = list(padding), list(padding)
    if pre:
        begin = [padding[0] + pre[2], padding[1] + pre[0]]
        end = [padding[0] + pre[3], padding[1] + pre[1]]
    wdt, wrank = c.dtypes[1], c.ranks[1]
    assert x is not None and w is not None
    assert wdt is not None and wrank is not None

    def f32(k: int) -> str | None:
        name, dt = c.names[k], c.dtypes[k]
        return None if name is None or dt is None else _to_f32(s, name, dt)

    if mean is None or var is None:  # a plain convolution the layout pass routed
        wf, bf = w, c.names[2]
    else:
        wf, bf = _bn_folded(s, f32, float(eps), wdt, wrank)
    conv_in = [x, wf] if bf is None else [x, wf, bf]
    last = other is None and act == "none"
    y = s.node(
        "Conv",
        conv_in,
        o if last else None,
        strides=list(stride),
        pads=begin + end,
        dilations=list(dilation),
        group=int(groups),
    )
    if last:
        return
    if other is not None:
        y = s.node("Add", [y, other], o if act == "none" else None)
        if act == "none":
            return
    _activation(s, y, act, wdt, o)


def _linear(s: Sink, c: _Call, x_rank: int, tensors: Sequence[str | None], out: list[str] | None) -> str:
    """x @ W'.T + b' with a LayerNorm affine (ln_w, ln_b) folded into W' and b' when given."""
    x, w, b, ln_w, ln_b = tensors
    assert x is not None and w is not None
    wdt = c.dtypes[1]
    assert wdt is not None
    if ln_w is not None or ln_b is not None:
        # In fp32 like the library's fold: b' = b + W @ ln_b (the original W), W' = W * ln_w.
        w32 = _to_f32(s, w, wdt)
        bias32 = None if b is None else _to_f32(s, b, wdt)
        if ln_b is not None:
            wb = s.node("MatMul", [w32, _to_f32(s, ln_b, wdt)])
            bias32 = wb if bias32 is None else s.node("Add", [bias32, wb])
        if ln_w is not None:
            w32 = s.node("Mul", [w32, _to_f32(s, ln_w, wdt)])
        w = _from_f32(s, w32, wdt)
        b = None if bias32 is None else _from_f32(s, bias32, wdt)
    if x_rank == 2:
        return s.node("Gemm", [x, w] + ([] if b is None else [b]), out, transB=1)
    y = s.node("MatMul", [x, s.node("Transpose", [w], perm=[1, 0])], out if b is None else None)
    return y if b is None else s.node("Add", [y, b], out)


@expands("linear_act")
def _linear_act(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    # linear_act(x, w, b?, ln_w?, ln_b?, act)
    c = _Call(s, n, i, 5, 1)
    (act,) = c.literals
    x_rank, wdt = c.ranks[0], c.dtypes[1]
    assert x_rank is not None and wdt is not None
    if act == "none":
        _linear(s, c, x_rank, c.names, o)
        return
    _activation(s, _linear(s, c, x_rank, c.names, None), act, wdt, o)


@expands("linear_residual")
def _linear_residual(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    # linear_residual(x, w, b?, other, ln_w?, ln_b?)
    c = _Call(s, n, i, 6, 0)
    x, w, b, other, ln_w, ln_b = c.names
    x_rank = c.ranks[0]
    assert other is not None and x_rank is not None
    s.node("Add", [_linear(s, c, x_rank, [x, w, b, ln_w, ln_b], None), other], o)


__all__ = ["EXPANSIONS", "expands"]
