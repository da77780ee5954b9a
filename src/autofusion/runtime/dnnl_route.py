"""The torch side of conv_bn_act's "dnnl" route: oneDNN convolutions created once (codegen/cpp/dnnl_conv).

In: channels-last activations, folded weights and bias (runtime/library.py's fold), the convolution's
attributes. Out: `create` makes a `ConvPrimitive` for one input shape and configuration (None where this
route cannot take it, or the glue is unavailable: the caller then runs another route), `run` executes
one on a fresh channels-last result tensor. library.py keeps the primitives in its fold cache, keyed by
the parameters' identity and version, so a changed parameter creates a new primitive with new weights.

`GLUE_CACHE` / `GLUE_PREFIX` say where the glue library is built and where oneDNN is installed (None:
the cache the environment names, `Options.from_env`, and sys.prefix); tests point the prefix at an
empty directory to hide oneDNN.
"""

from __future__ import annotations

import logging
import tempfile

import torch

from autofusion.codegen.cpp import dnnl_conv
from autofusion.codegen.cpp.build import BuiltLibrary
from autofusion.codegen.cpp.dnnl_conv import ConvPrimitive, DnnlError

GLUE_CACHE: str | None = None
GLUE_PREFIX: str | None = None
_CL = torch.channels_last
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
log = logging.getLogger("autofusion.runtime")


def _where() -> tuple[str, str]:
    """(the cache the glue is built in, the compiler that builds it)."""
    if GLUE_CACHE is not None:
        return GLUE_CACHE, "g++"
    from autofusion.config.options import Options

    opts = Options.from_env()
    return opts.cache_dir or tempfile.gettempdir() + "/autofusion-dnnl", opts.cxx


def glue() -> dnnl_conv.Glue | None:
    """The loaded glue, or None (the reason logged once by dnnl_conv.load_glue)."""
    cache, cxx = _where()
    return dnnl_conv.load_glue(cache, cxx=cxx, prefix=GLUE_PREFIX)


def adopt(built: BuiltLibrary, inst: dnnl_conv.Install) -> dnnl_conv.Glue | None:
    """Take a saved package's glue (installed into the cache) as the one `glue` returns: a process with
    no compiler then runs the route too (dnnl_conv.adopt; None, the reason logged, where it cannot)."""
    return dnnl_conv.adopt(built, inst, cxx=_where()[1], prefix=GLUE_PREFIX)


def available() -> bool:
    return glue() is not None


def status() -> str | None:
    """None when the glue loads, else why not (what SuperKernel planning logs for its convolutions)."""
    if glue() is not None:
        return None
    return dnnl_conv.unavailable_reason(GLUE_PREFIX) or "the oneDNN glue did not load"


def takes(shape: tuple[int, ...], dtype: torch.dtype, w: torch.Tensor, act: str) -> bool:
    """Can this route run the convolution of a CPU input of `shape` and `dtype` at all (before asking
    oneDNN)?"""
    return (
        len(shape) == 4
        and w.dim() == 4
        and w.device.type == "cpu"
        and dtype in _DTYPES
        and w.dtype == dtype
        and act in dnnl_conv.ACTIVATIONS
        and all(s > 0 for s in shape)
    )


def pads(padding: list[int], pre_pad: list[int] | tuple[int, ...] | None) -> tuple[int, int, int, int] | None:
    """(top, left, bottom, right): the convolution's symmetric padding plus a zero `pre_pad` (F.pad's
    order: w before, w after, h before, h after) folded in; None when pre_pad crops (negative)."""
    pt = pb = int(padding[0])
    pl = pr = int(padding[1])
    if pre_pad:
        if len(pre_pad) not in (2, 4) or any(p < 0 for p in pre_pad):
            return None
        pl, pr = pl + int(pre_pad[0]), pr + int(pre_pad[1])
        if len(pre_pad) == 4:
            pt, pb = pt + int(pre_pad[2]), pb + int(pre_pad[3])
    return pt, pl, pb, pr


def create(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    wf: torch.Tensor,
    bias: torch.Tensor | None,
    residual: bool,
    stride: list[int],
    padding: tuple[int, int, int, int],
    dilation: list[int],
    groups: int,
    act: str,
) -> ConvPrimitive | None:
    """A primitive for an input of `shape` and `dtype` (weights `wf` in torch's layout, float32 `bias`),
    or None."""
    g = glue()
    if g is None:
        return None
    n, c, h, w = (int(s) for s in shape)
    k, _, kh, kw = (int(s) for s in wf.shape)
    wc = wf.contiguous()
    bc = None if bias is None else bias.float().contiguous()
    try:
        return ConvPrimitive(
            g, _DTYPES[dtype], n, c, h, w, k, kh, kw, (int(stride[0]), int(stride[1])), padding,
            (int(dilation[0]), int(dilation[1])), int(groups), wc.data_ptr(),
            None if bc is None else bc.data_ptr(), act, residual,
        )  # fmt: skip
    except DnnlError as e:
        log.info("conv_bn_act: oneDNN cannot create this convolution (%s); another route", e)
        return None


def run(prim: ConvPrimitive, x: torch.Tensor, k: int, other: torch.Tensor | None) -> torch.Tensor | None:
    """act(conv(x) [+ other]) into a fresh channels-last tensor; None where `other` does not fit."""
    xc = x.contiguous(memory_format=_CL)
    y = torch.empty((x.shape[0], k, prim.oh, prim.ow), dtype=x.dtype, memory_format=_CL)
    if other is None:
        prim.execute(xc.data_ptr(), y.data_ptr())
        return y
    if other.shape != y.shape:
        return None  # a broadcast residual: the binary post-op was created for the result's shape
    oc = other.to(x.dtype).contiguous(memory_format=_CL)
    prim.execute(xc.data_ptr(), y.data_ptr(), oc.data_ptr())
    return y
