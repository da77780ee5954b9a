"""Which routed convolutions a SuperKernel entry can run itself: oneDNN's, through the dnnl glue.

In: an op step's node (a `conv_bn_act` library call, passes/layout.py's routed form), the graph's value
types, the real strides of the values whose layout is known before running (entry_ops._real_strides)
and the values some plan step computes. Out: `dnnl_conv_in_entry`, None when the entry can call the
convolution's oneDNN primitive (codegen/cpp/dnnl_conv.cpp's `af_dnnl_conv_execute`) between its
parallel regions, else why not; `conv_args`, where the call's tensors and literals sit.

The entry gets the primitive's handle at call time (runtime/super_executor.py makes it, once per
parameter version, as the route does outside an entry), so what the entry itself needs is what the
primitive was created for: the input, the residual and the result in NHWC at the IR type's strides, of
the primitive's dtype, the residual of the result's shape, and parameters that exist before the entry
runs (graph inputs or constants, not values a member computes).
"""

from __future__ import annotations

from dataclasses import dataclass

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Node
from autofusion.ir.targets import RULES_NAMESPACE
from autofusion.ir.types import TensorType, strides_match

CONV_TARGET = f"{RULES_NAMESPACE}.conv_bn_act.default"
# conv_bn_act's argument template: x, w, b, mean, var, gamma, beta, other, then the literals.
_X, _OTHER, _PARAMS = 0, 7, range(1, 7)
_EPS, _STRIDE, _PADDING, _DILATION, _GROUPS, _ACT, _ROUTE, _CL, _PRE_PAD = range(8, 17)
# dnnl_conv.py's ACTIVATIONS spelled out (the plan layer does not import the code generator).
_ACTS = ("none", "relu", "relu6", "silu", "sigmoid", "gelu", "gelu_tanh", "hardswish")
_DTYPES = (DType.float32, DType.bfloat16)


@dataclass(frozen=True)
class ConvArgs:
    """A conv_bn_act call's parts: value ids (None: absent) and literals."""

    x: int
    other: int | None
    params: tuple[int | None, ...]  # w, b, mean, var, gamma, beta
    eps: float
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    act: str
    route: str
    channels_last: bool
    pre_pad: tuple[int, ...] | None


def is_conv_call(node: Node) -> bool:
    return node.op == "extern" and node.attr("target") == CONV_TARGET and not node.attr("kwargs")


def conv_args(node: Node) -> ConvArgs | None:
    """The call's parts, or None where its template is not conv_bn_act's routed form."""
    args = tuple(node.attr("args"))
    if len(args) not in (16, 17) or not isinstance(args[_X], Arg) or not isinstance(args[1], Arg):
        return None

    def value(a: object) -> int | None:
        return node.inputs[a.index] if isinstance(a, Arg) else None

    x = value(args[_X])
    assert x is not None
    pre = args[_PRE_PAD] if len(args) == 17 else None
    return ConvArgs(
        x, value(args[_OTHER]), tuple(value(a) for a in args[1:7]), float(args[_EPS]), tuple(args[_STRIDE]),
        tuple(args[_PADDING]), tuple(args[_DILATION]), int(args[_GROUPS]), str(args[_ACT]), str(args[_ROUTE]),
        bool(args[_CL]), None if pre is None else tuple(pre),
    )  # fmt: skip


def nhwc_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    _, c, h, w = (max(1, d) for d in shape)
    return (h * w * c, 1, w * c, c)


def _nhwc(t: TensorType, real: tuple[int, ...] | None) -> bool:
    if t.rank != 4:
        return False
    want = nhwc_strides(t.shape)
    return strides_match(t.shape, t.strides, want) and (real is None or strides_match(t.shape, real, want))


def dnnl_conv_in_entry(node: Node, types: dict[int, TensorType], real: dict[int, tuple[int, ...]],
                       computed: set[int], outputs: set[int]) -> str | None:  # fmt: skip
    """None when an entry can run this op step's convolution through oneDNN, else why not. `computed`:
    values some plan step produces; `outputs`: the graph's outputs."""
    c = conv_args(node)
    if c is None:
        return "the convolution call is not in the routed form"
    if c.route != "dnnl":
        return f"the convolution runs the {c.route!r} route (only 'dnnl' has a C-callable primitive)"
    if not c.channels_last:
        return "the convolution hands back NCHW (a copy through torch)"
    if len(c.stride) != 2 or c.act not in _ACTS:
        return f"not a 2-d convolution with a oneDNN post-op ({c.act})"
    x, out = types[c.x], node.outputs[0].type
    w = types[c.params[0]] if c.params[0] is not None else None
    if x.dtype not in _DTYPES or out.dtype is not x.dtype or w is None or w.dtype is not x.dtype:
        return "oneDNN's convolution here takes float32 or bfloat16, input, weight and result alike"
    if min(x.shape, default=0) < 1:
        return "an empty input"
    if not _nhwc(x, real.get(c.x)):
        return "the input is not channels-last"
    if not _nhwc(out, None):
        return "the result is not declared channels-last"
    if node.outputs[0].id in outputs:
        return "the result is a graph output (output buffers are contiguous)"
    if c.other is not None:
        o = types[c.other]
        if o.shape != out.shape or o.dtype is not out.dtype or not _nhwc(o, real.get(c.other)):
            return "the residual is not a channels-last tensor of the result's shape and dtype"
        if c.other == c.x:
            return "the residual is the input"
    if any(p is not None and p in computed for p in c.params):
        return "a parameter is computed by the plan (the primitive is made before the entry runs)"
    return None
