"""Converters for library compute: matmul family, linear, convolution and attention (IR anchors)."""

from __future__ import annotations

import math
from typing import Any

from autofusion.frontend.torch.context import TV, ConvCtx, converts, unsupported
from autofusion.ir.catalog import broadcast_shapes


@converts("mm")
def _mm(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return ctx.add("mm", (a["self"], a["mat2"]))


@converts("bmm")
def _bmm(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return ctx.add("bmm", (a["self"], a["mat2"]))


@converts("addmm")
def _addmm(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return ctx.add("addmm", (a["self"], a["mat1"], a["mat2"]),
                   {"beta": float(a.get("beta", 1)), "alpha": float(a.get("alpha", 1))})  # fmt: skip


@converts("linear")
def _linear(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x, w, b = a["input"], a["weight"], a.get("bias")
    if x.rank == 0 or w.rank != 2:
        raise unsupported(f"linear with input rank {x.rank} and weight rank {w.rank}")
    return ctx.add("linear", (x, w) if b is None else (x, w, b), {"has_bias": b is not None})


@converts("matmul")
def _matmul(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    """torch.matmul's broadcasting rules, lowered to mm or bmm plus views."""
    x, y = a["self"], a["other"]
    if x.rank == 0 or y.rank == 0:
        raise unsupported("matmul of a 0-d tensor")
    out_shape = ctx.out_type.shape
    xs = x if x.rank > 1 else ctx.reshape(x, (1, x.shape[0]))
    ys = y if y.rank > 1 else ctx.reshape(y, (y.shape[0], 1))
    (m, k), (_, n) = xs.shape[-2:], ys.shape[-2:]
    if ys.rank == 2:
        # [..., m, k] @ [k, n]: fold the batch into rows and use one mm.
        rows = math.prod(xs.shape[:-1])
        out = ctx.add("mm", (ctx.reshape(xs, (rows, k)), ys))
        return ctx.reshape(out, out_shape)
    batch = broadcast_shapes(xs.shape[:-2], ys.shape[:-2])
    nb = math.prod(batch)
    xe = xs if xs.shape[:-2] == batch else ctx.add("expand", (xs,), {"shape": (*batch, m, k)})
    ye = ys if ys.shape[:-2] == batch else ctx.add("expand", (ys,), {"shape": (*batch, k, n)})
    out = ctx.add("bmm", (ctx.reshape(xe, (nb, m, k)), ctx.reshape(ye, (nb, k, n))))
    return ctx.reshape(out, out_shape)


def _tuple(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(x) for x in v)
    return v * n if len(v) == 1 else v


def conv_node(ctx: ConvCtx, x: TV, w: TV, b: TV | None, stride: Any, padding: Any, dilation: Any,
              transposed: bool, output_padding: Any, groups: int) -> TV:  # fmt: skip
    n = w.rank - 2
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same" and not transposed:
            x, padding = _same_padding(ctx, x, w, stride, dilation, n)
        else:
            raise unsupported(f"padding={padding!r}")
    attrs = {
        "stride": _tuple(stride, n), "padding": _tuple(padding, n), "dilation": _tuple(dilation, n),
        "transposed": bool(transposed), "output_padding": _tuple(output_padding, n), "groups": int(groups),
        "has_bias": b is not None,
    }  # fmt: skip
    if x.rank == n + 1:
        raise unsupported("unbatched convolution input")
    return ctx.add("conv", (x, w) if b is None else (x, w, b), attrs)


def _same_padding(
    ctx: ConvCtx, x: TV, w: TV, stride: Any, dilation: Any, n: int
) -> tuple[TV, tuple[int, ...]]:
    """`padding='same'` as torch computes it: per spatial dim `dilation * (kernel - 1)` in all, half of it
    (rounded down) before, the rest after. The symmetric part becomes the convolution's own padding (a
    plain conv node, which the rules and the layout pass take like any other); an odd total (an even
    kernel) adds the one extra element after as an explicit zero `pad` first, as torch itself does."""
    if any(s != 1 for s in _tuple(stride, n)):
        raise unsupported("padding='same' with a stride other than 1 (torch rejects it too)")
    totals = [d * (k - 1) for d, k in zip(_tuple(dilation, n), w.shape[2:], strict=True)]
    lo = tuple(t // 2 for t in totals)
    extra = [t - 2 * low for t, low in zip(totals, lo, strict=True)]
    if any(extra):
        pads: list[int] = []  # constant_pad_nd's order: the last dim first, (before, after) each
        for e in reversed(extra):
            pads += [0, e]
        x = ctx.add("pad", (x,), {"pads": tuple(pads), "value": 0.0 if x.dtype.is_float else 0})
    return x, lo


@converts("convolution", "_convolution")
def _convolution(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return conv_node(ctx, a["input"], a["weight"], a.get("bias"), a["stride"], a["padding"], a["dilation"],
                     a["transposed"], a["output_padding"], a["groups"])  # fmt: skip


@converts("conv1d", "conv2d", "conv3d")
def _convnd(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return conv_node(ctx, a["input"], a["weight"], a.get("bias"), a.get("stride", 1), a.get("padding", 0),
                     a.get("dilation", 1), False, 0, a.get("groups", 1))  # fmt: skip


@converts("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
def _conv_transpose(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return conv_node(ctx, a["input"], a["weight"], a.get("bias"), a.get("stride", 1), a.get("padding", 0),
                     a.get("dilation", 1), True, a.get("output_padding", 0), a.get("groups", 1))  # fmt: skip


@converts("scaled_dot_product_attention")
def _sdpa(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    if a.get("dropout_p", 0.0):
        raise unsupported("attention dropout is random; inference uses dropout_p=0")
    if a.get("enable_gqa", False):
        raise unsupported("grouped-query attention (enable_gqa=True)")
    q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
    scale = a.get("scale")
    attrs = {"is_causal": bool(a.get("is_causal", False)), "has_mask": mask is not None,
             "scale": None if scale is None else float(scale)}  # fmt: skip
    return ctx.add("sdpa", (q, k, v) if mask is None else (q, k, v, mask), attrs)
