"""Library implementations a rule can turn a matched window into (`becomes: library:<name>`).

In: a `Match` (which graph nodes and values a rule bound) and the graph. Out: replacement IR added
through a `passes.rebuild.Emitter`; before any of that, `check` says why it cannot apply (or None), so
the rule pass never half-applies a window.

Implementations (registered in LIBRARY):
- `conv_bn_act`: Conv + BatchNorm (+ residual Add) (+ ReLU / ReLU6 / SiLU) in eval. BN is folded into
  the convolution's weight and bias (w' = w * g/sqrt(v+eps) per output channel,
  b' = (b - m) * g/sqrt(v+eps) + beta), and the activation runs as oneDNN's fused post-op
  (`torch.ops.mkldnn._convolution_pointwise`, which torch 2.13's CPU build provides; a residual add is
  its binary post-op) on weights prepacked in oneDNN's blocked layout. The fold and the packing are
  computed once per parameter version (and input shape) and cached, so they cost nothing per call
  and stay right if a parameter is changed in place. Which route runs (that one, or torch.convolution
  on the folded weights in NCHW or channels-last) is chosen per chain of convolutions by measurement,
  after the rules (`passes/layout.py`); without oneDNN the folded weights go through torch.
- `linear_act`: Linear (+ bias) + ReLU / GELU / SiLU as one ATen call where ATen has one
  (`torch._addmm_activation`: GEMM with a ReLU/GELU epilogue), optionally with a preceding LayerNorm's
  affine folded into the weight (`layernorm_*_linear` rules: W' = W * gamma, b' = b + W @ beta; the
  LayerNorm keeps only its normalisation, which stays a generated kernel).
- `linear_residual`: Linear (+ bias) + residual Add, the add done in place on the GEMM's output.
- `conv_act` (`conv_act.py`): a convolution without BatchNorm (+ residual Add) (+ ReLU / ReLU6 / SiLU),
  as the same `conv_bn_act` call with no BN tensors (ONNX exports have BN folded into the conv).
- `sdpa`: the attention core (matmul -> scale -> optional mask -> softmax -> matmul) becomes the IR's
  `sdpa` op, which runs `torch.nn.functional.scaled_dot_product_attention`.
The torch operators live in the `autofusion_rules` namespace (registered by `runtime/library.py`, which
the compiler imports); graphs call them through `extern` nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autofusion.ir.analysis import producer, value_types
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, Node
from autofusion.ir.targets import CONV_POST_OPS, RESIDUAL_POST_OPS, RULES_NAMESPACE
from autofusion.ir.types import TensorType
from autofusion.passes.rebuild import Emitter
from autofusion.passes.rewrite import conv_act
from autofusion.passes.rewrite.post_ops import activation, residual

if TYPE_CHECKING:
    from autofusion.passes.rewrite.match import Match

NAMESPACE = RULES_NAMESPACE  # the operators `runtime/library.py` registers

# ---- builders: match -> IR -------------------------------------------------------------------------


def _call(e: Emitter, fn: str, tensors: list[int | None], literals: tuple[Any, ...], out: TensorType) -> int:
    """Call `autofusion_rules.<fn>` with tensor arguments (None for an absent optional) then literals."""
    target = f"{NAMESPACE}.{fn}.default"
    return e.extern(target, tensors, literals, out, reason="fusion rule", name=f"{fn}_{e.node.name}")


@dataclass(frozen=True)
class Library:
    name: str
    check: Callable[[Graph, Match], str | None]
    emit: Callable[[Emitter, Graph, Match], int]
    doc: str


def _producer(g: Graph, vid: int) -> Node | None:
    k = producer(g).get(vid)
    return None if k is None else g.nodes[k]


def _literal_scalar(g: Graph, vid: int) -> float | None:
    prod = _producer(g, vid)
    if prod is None or prod.op != "full" or tuple(prod.attr("shape") or ()) != ():
        return None
    v = prod.attr("value")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# conv + batch_norm (+ act)


def _conv_check(g: Graph, m: Match) -> str | None:
    conv, bn = m.node_of("conv"), m.node_of("batch_norm")
    if conv is None or bn is None:
        return "the window has no conv -> batch_norm pair"
    a = conv.attr_dict
    if a["transposed"]:
        return "a transposed convolution is not a convolution: BN cannot fold into its weight this way"
    if any(o != 0 for o in a["output_padding"]):
        return "output_padding is set"
    if bn.inputs[0] != conv.out.id:
        return "batch_norm does not normalise the conv output"
    types = value_types(g)
    x, w = types[conv.inputs[0]], types[conv.inputs[1]]
    if not (x.dtype.is_float and x.dtype == w.dtype == conv.out.type.dtype == bn.out.type.dtype):
        return f"dtypes differ or are not float ({x.dtype.short}, {w.dtype.short})"
    if any(types[i].dtype != x.dtype for i in bn.inputs):
        return "batch_norm parameters have another dtype than the convolution"
    if w.shape[0] != conv.out.type.shape[1]:
        return "weight dim 0 is not the output channel dim"
    add = m.node_of("add")
    if add is not None:
        other = residual(add, bn.out.id)
        if other is None or types[other].shape != bn.out.type.shape or types[other].dtype != x.dtype:
            return "the residual does not have the conv output's shape and dtype"
        if add.inputs[0] != bn.out.id and add.inputs[1] != bn.out.id:
            return "the add does not take the batch_norm output"
    act_nodes = [n for n in m.nodes() if n not in (conv, bn, add)]
    if len(act_nodes) > 1 or activation(act_nodes[0] if act_nodes else None) not in CONV_POST_OPS:
        return "the activation is not relu, relu6 or silu"
    if add is not None and activation(act_nodes[0] if act_nodes else None) not in RESIDUAL_POST_OPS:
        return "oneDNN's binary post-op is followed by relu or nothing here"
    return None


def _conv_emit(e: Emitter, g: Graph, m: Match) -> int:
    conv, bn = m.node_of("conv"), m.node_of("batch_norm")
    assert conv is not None and bn is not None
    add = m.node_of("add")
    other = residual(add, bn.out.id) if add is not None else None
    act_nodes = [n for n in m.nodes() if n not in (conv, bn, add)]
    act = activation(act_nodes[0] if act_nodes else None) or "none"
    a, ba = conv.attr_dict, bn.attr_dict
    bn_in = iter(bn.inputs[3:])
    gamma = next(bn_in) if ba["has_weight"] else None
    beta = next(bn_in) if ba["has_bias"] else None
    tensors = [
        conv.inputs[0],
        conv.inputs[1],
        conv.inputs[2] if a["has_bias"] else None,
        bn.inputs[1],
        bn.inputs[2],
        gamma,
        beta,
        other,
    ]
    final = m.final()
    lits = (
        float(ba["eps"]),
        tuple(a["stride"]),
        tuple(a["padding"]),
        tuple(a["dilation"]),
        int(a["groups"]),
        act,
    )
    return _call(e, "conv_bn_act", [None if t is None else e.v(t) for t in tensors], lits, final.out.type)


# linear + act / residual (optionally after a LayerNorm whose affine folds in)


def _ln_parts(m: Match) -> tuple[Node | None, int | None, int | None]:
    ln = m.node_of("layer_norm")
    if ln is None:
        return None, None, None
    it = iter(ln.inputs[1:])
    w = next(it) if ln.attr("has_weight") else None
    b = next(it) if ln.attr("has_bias") else None
    return ln, w, b


def _prologue(m: Match, lin: Node) -> Node | None:
    p = m.producer_in_window(lin.inputs[0])
    return p if p is not None and p.op != "layer_norm" else None


def _epilogue(m: Match, lin: Node) -> list[Node]:
    pro = _prologue(m, lin)
    return [n for n in m.nodes() if n.op not in ("linear", "layer_norm") and n is not pro]


def _linear_check(g: Graph, m: Match) -> str | None:
    lin = m.node_of("linear")
    if lin is None:
        return "the window has no linear"
    types = value_types(g)
    x, w = types[lin.inputs[0]], types[lin.inputs[1]]
    if not (x.dtype.is_float and x.dtype == w.dtype):
        return f"linear dtypes are not one float type ({x.dtype.short}, {w.dtype.short})"
    ln, _, _ = _ln_parts(m)
    if ln is not None and (ln.attr("normalized_ndim") != 1 or lin.inputs[0] != ln.out.id):
        return "layer_norm must normalise the last dim and feed the linear directly"
    others = _epilogue(m, lin)
    if len(others) > 1:
        return "more than one epilogue op"
    if others and others[0].op == "add":
        add = others[0]
        res = add.inputs[1] if add.inputs[0] == lin.out.id else add.inputs[0]
        if types[res].shape != lin.out.type.shape or types[res].dtype != x.dtype:
            return f"the residual {types[res]} does not have the linear output's type {lin.out.type}"
        return None
    act = activation(others[0] if others else None)
    if act is None:
        return f"{others[0].op} is not an activation oneDNN fuses"
    return None


def _linear_emit(e: Emitter, g: Graph, m: Match) -> int:
    lin = m.node_of("linear")
    assert lin is not None
    ln, ln_w, ln_b = _ln_parts(m)
    x = lin.inputs[0]
    pro = _prologue(m, lin)
    if pro is not None:
        # An elementwise prologue (gelu_linear_residual's GELU) stays an IR op: a generated kernel.
        x_new = e(pro.op, [e.v(i) for i in pro.inputs], dict(pro.attrs))
    elif ln is not None:
        # Keep only the normalisation; the affine goes into the weight (cached fold, see module doc).
        x_new = e(
            "layer_norm",
            [e.v(ln.inputs[0])],
            {"normalized_ndim": 1, "eps": ln.attr("eps"), "has_weight": False, "has_bias": False},
        )
    else:
        x_new = e.v(x)
    bias = e.v(lin.inputs[2]) if lin.attr("has_bias") else None
    lnw = None if ln_w is None else e.v(ln_w)
    lnb = None if ln_b is None else e.v(ln_b)
    others = _epilogue(m, lin)
    out_t = m.final().out.type
    if others and others[0].op == "add":
        add = others[0]
        res = add.inputs[1] if add.inputs[0] == lin.out.id else add.inputs[0]
        return _call(e, "linear_residual", [x_new, e.v(lin.inputs[1]), bias, e.v(res), lnw, lnb], (), out_t)
    act = activation(others[0] if others else None) or "none"
    return _call(e, "linear_act", [x_new, e.v(lin.inputs[1]), bias, lnw, lnb], (act,), out_t)


# attention core -> sdpa


def _through_reshapes(g: Graph, vid: int) -> list[int]:
    """vid and the values it was reshaped from, nearest first."""
    chain = [vid]
    while (p := _producer(g, chain[-1])) is not None and p.op == "reshape":
        chain.append(p.inputs[0])
    return chain


def _attn_parts(g: Graph, m: Match) -> dict[str, Any] | str:
    mms = [n for n in m.nodes() if n.op in ("bmm", "mm")]
    soft = m.node_of("softmax")
    if len(mms) != 2 or soft is None:
        return "needs two matmuls around a softmax"
    mm1, mm2 = sorted(mms, key=lambda n: m.position(n))
    scale_node = next((n for n in m.nodes() if n.op in ("mul", "div")), None)
    scores_shape = soft.out.type.shape
    if soft.attr("dim") % len(scores_shape) != len(scores_shape) - 1:
        return "softmax is not over the last dim"
    if len(scores_shape) < 2:
        return "scores of rank < 2"
    scale = 1.0
    if scale_node is not None:
        sv = [i for i in scale_node.inputs if _literal_scalar(g, i) is not None]
        if len(sv) != 1 or (scale_node.op == "div" and scale_node.inputs[1] != sv[0]):
            return "the scale is not a scalar literal"
        c = _literal_scalar(g, sv[0])
        assert c is not None
        if c == 0 or not math.isfinite(c):
            return f"scale {c} is not a finite non-zero number"
        scale = 1.0 / c if scale_node.op == "div" else c
    mask, mask_kind = None, ""
    where = m.node_of("where")
    add = next((n for n in m.nodes() if n.op == "add"), None)
    types = value_types(g)
    if where is not None:
        fill = _literal_scalar(g, where.inputs[1])
        if fill != -math.inf:
            return "the masked fill is not -inf"
        mask, mask_kind = where.inputs[0], "where"
    elif add is not None:
        others = [i for i in add.inputs if m.producer_in_window(i) is None]
        if len(others) != 1:
            return "the additive mask is not an outside tensor"
        mask, mask_kind = others[0], "add"
    if mask is not None:
        try:
            from autofusion.ir.catalog import broadcast_shapes

            if broadcast_shapes(types[mask].shape, scores_shape) != scores_shape:
                return "the mask does not broadcast to the scores"
        except ValueError:
            return "the mask does not broadcast to the scores"
        if mask_kind == "add" and types[mask].dtype != soft.out.type.dtype:
            return "the additive mask has another dtype"
    q3, kt3, v3 = mm1.inputs[0], mm1.inputs[1], mm2.inputs[1]
    lead = scores_shape[:-2]
    lq, lk = scores_shape[-2], scores_shape[-1]
    e_dim, ev = types[q3].shape[-1], types[v3].shape[-1]
    if types[q3].dtype != types[v3].dtype or not types[q3].dtype.is_float:
        return "q, k, v are not of one float dtype"
    return {
        "mm1": mm1,
        "mm2": mm2,
        "q": q3,
        "kt": kt3,
        "v": v3,
        "scale": scale,
        "mask": mask,
        "kind": mask_kind,
        "q_shape": (*lead, lq, e_dim),
        "kt_shape": (*lead, e_dim, lk),
        "v_shape": (*lead, lk, ev),
    }


def _attn_check(g: Graph, m: Match) -> str | None:
    parts = _attn_parts(g, m)
    return parts if isinstance(parts, str) else None


def _attn_emit(e: Emitter, g: Graph, m: Match) -> int:
    parts = _attn_parts(g, m)
    assert isinstance(parts, dict)
    types = value_types(g)

    def as_shape(vid: int, shape: tuple[int, ...]) -> int:
        # Use the value before its reshapes when it already has the wanted shape (no copy of a permuted view).
        for c in _through_reshapes(g, vid):
            if types[c].shape == shape:
                return e.v(c)
        return e("reshape", [e.v(vid)], {"shape": shape})

    q = as_shape(parts["q"], parts["q_shape"])
    kt_shape = parts["kt_shape"]
    k = None
    for c in _through_reshapes(g, parts["kt"]):
        p = _producer(g, c)
        r = len(kt_shape)
        if types[c].shape == kt_shape and p is not None and p.op == "permute" and r >= 2:
            dims = tuple(p.attr("dims"))
            if dims == (*range(r - 2), r - 1, r - 2):
                k = e.v(p.inputs[0])  # K^T was a transpose of K: take K itself
                break
    if k is None:
        kt = as_shape(parts["kt"], kt_shape)
        r = len(kt_shape)
        k = e("permute", [kt], {"dims": (*range(r - 2), r - 1, r - 2)})
    v = as_shape(parts["v"], parts["v_shape"])
    inputs = [q, k, v]
    if parts["mask"] is not None:
        mv = e.v(parts["mask"])
        inputs.append(e("logical_not", [mv]) if parts["kind"] == "where" else mv)
    out = e(
        "sdpa", inputs, {"is_causal": False, "has_mask": parts["mask"] is not None, "scale": parts["scale"]}
    )
    want = m.final().out.type.shape
    return out if e.b.type_of(out).shape == want else e("reshape", [out], {"shape": want})


LIBRARY: dict[str, Library] = {
    "conv_bn_act": Library(
        "conv_bn_act",
        _conv_check,
        _conv_emit,
        "BN folded into the conv weight; activation as a oneDNN post-op",
    ),
    "linear_act": Library(
        "linear_act",
        _linear_check,
        _linear_emit,
        "oneDNN linear with a fused activation (LayerNorm affine folded when present)",
    ),
    "linear_residual": Library(
        "linear_residual",
        _linear_check,
        _linear_emit,
        "oneDNN linear with the residual add as a binary post-op",
    ),
    "sdpa": Library("sdpa", _attn_check, _attn_emit, "scaled_dot_product_attention"),
}
LIBRARY["conv_act"] = Library(
    "conv_act",
    conv_act.check,
    conv_act.emit,
    "a convolution without BN as conv_bn_act: residual and activation as oneDNN post-ops",
)
KNOWN = frozenset(LIBRARY)
_ = DType  # re-exported for builders that check dtypes
