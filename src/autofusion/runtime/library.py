"""The torch half of the library rules: the `autofusion_rules` operators graphs call through externs.

In: tensors (and literals) as the rewrite pass's `extern` nodes pass them (`passes/rewrite/library.py`
says what each rule turns into). Out: the operator's result. Importing this module registers the
operators with torch (namespace `autofusion_rules`) and with the IR interpreter, so the compiled plan,
the reference runtime and exported graphs all run the same code. BN folds and oneDNN prepacking are
cached per parameter version (`FOLDS`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from autofusion.ir.interpret import PY_TARGETS
from autofusion.ir.targets import POST_OPS_ONEDNN
from autofusion.ir.targets import RULES_NAMESPACE as NAMESPACE
from autofusion.runtime import dnnl_route

# ---- torch operators ---------------------------------------------------------------------------------

_ACT_ONEDNN = POST_OPS_ONEDNN  # the post-ops the rules match (ir/targets.py)


def _act_torch(y: torch.Tensor, act: str) -> torch.Tensor:
    if act == "relu":
        return F.relu(y)
    if act == "relu6":
        return F.hardtanh(y, 0.0, 6.0)
    if act == "silu":
        return F.silu(y)
    if act == "gelu":
        return F.gelu(y)
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    return y


def _version(t: torch.Tensor) -> int:
    # Tensors made under torch.inference_mode() have no version counter: an in-place change to such a
    # parameter cannot be seen (torch itself cannot either), so their fold is kept until they are freed.
    return -1 if t.is_inference() else t._version


_T = TypeVar("_T")


class _FoldCache:
    """Folded (and packed) parameters keyed by the identity and version of the tensors they came from.

    An entry is dropped as soon as one of its source tensors is freed (a weakref callback), so the
    cache holds one copy per live parameter set; `size` only bounds models whose parameters are
    passed afresh on every call (each call then misses and folds again, which stays correct)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.items: OrderedDict[tuple[Any, ...], tuple[list[Any], Any]] = OrderedDict()
        # Re-entrant: a weakref callback may run (garbage collection) while this thread holds the lock.
        self.lock = threading.RLock()
        self.misses = 0
        # tag -> its one key, for callers that keep one entry per tag (`get(..., single=True)`): the value
        # folded for an older version is dropped when the new one is stored, not kept until eviction.
        self.latest: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.tag_of: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # key -> tag, for those entries

    def _drop(self, key: tuple[Any, ...]) -> None:
        with self.lock:
            self.items.pop(key, None)
            tag = self.tag_of.pop(key, None)
            if tag is not None and self.latest.get(tag) == key:
                del self.latest[tag]

    def discard(self, tag: tuple[Any, ...]) -> None:
        """Drop the entry stored for `tag` with `single=True` (its owner is gone)."""
        with self.lock:
            key = self.latest.pop(tag, None)
            if key is not None:
                self.items.pop(key, None)
                self.tag_of.pop(key, None)

    def get(
        self,
        tag: tuple[Any, ...],
        sources: list[torch.Tensor | None],
        compute: Callable[[], _T],
        single: bool = False,
    ) -> _T:
        key = tag + tuple(
            None if t is None else (t.data_ptr(), _version(t), t.dtype, tuple(t.shape)) for t in sources
        )
        with self.lock:
            hit = self.items.get(key)
            if hit is not None and all(
                (r is None and t is None) or (r is not None and r() is t)
                for r, t in zip(hit[0], sources, strict=True)
            ):
                self.items.move_to_end(key)
                found: _T = hit[1]
                return found
        with torch.no_grad():
            value = compute()

        def forget(_ref: weakref.ReferenceType[torch.Tensor], k: tuple[Any, ...] = key) -> None:
            self._drop(k)

        refs = [None if t is None else weakref.ref(t, forget) for t in sources]
        with self.lock:
            self.misses += 1
            if single:
                old = self.latest.get(tag)
                if old is not None and old != key:
                    self.items.pop(old, None)
                    self.tag_of.pop(old, None)
                self.latest[tag] = key
                self.tag_of[key] = tag
            self.items[key] = (refs, value)
            while len(self.items) > self.size:
                self._drop(next(iter(self.items)))
        return value


FOLDS = _FoldCache()


# How conv_bn_act runs (its `route` literal, chosen per chain of convolutions by the layout pass from
# timings taken on this machine, passes/layout.py):
#   "aten"    torch.convolution on the folded weights, in whatever layout the input has (the default,
#             and what every graph written before routes existed calls);
#   "aten_cl" torch.convolution on channels-last input and weights;
#   "onednn"  oneDNN's fused convolution (_convolution_pointwise) on channels-last input with weights
#             prepacked in its blocked layout; activation and residual add as its post-ops.
#   "dnnl"    the same oneDNN convolution called directly (runtime/dnnl_route.py): its primitive and
#             reordered weights are created once per input shape and parameter version and kept here,
#             so a call costs the primitive's execution (ATen creates the primitive descriptor per
#             call); an asymmetric `pre_pad` becomes the primitive's own padding. Where the oneDNN
#             library or its glue is unavailable, or oneDNN declines, the call runs "onednn".
# `channels_last` says the layout of the result: channels-last (True) or contiguous NCHW (False), so it
# always matches the type the graph declares for it. FORCE_ROUTE overrides the literal (tests).
ROUTES = ("aten", "aten_cl", "onednn", "dnnl")
FORCE_ROUTE: str | None = None
# Calls per route that really ran (a declined oneDNN call counts as "aten"): tests prove a route ran.
ROUTE_CALLS: Counter[str] = Counter()
# conv_bn_act calls that padded their input first (`pre_pad`), by the padded input's layout.
PRE_PAD_CALLS: Counter[str] = Counter()
_CL = torch.channels_last
log = logging.getLogger("autofusion.runtime")


def onednn_ok(x: torch.Tensor) -> bool:
    dtypes = (torch.float32, torch.bfloat16)
    return torch.backends.mkldnn.is_available() and x.dtype in dtypes and x.dim() == 4


def conv_bn_act(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    mean: torch.Tensor | None,
    var: torch.Tensor | None,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    other: torch.Tensor | None,
    eps: float,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    act: str,
    route: str = "aten",
    channels_last: bool = False,
    pre_pad: list[int] | tuple[int, ...] | None = None,
) -> torch.Tensor:
    """act(conv(x, w', b') [+ other]) with BN folded into w', b' (no BN when mean is None). `pre_pad`:
    a zero padding of x before it (F.pad's order: last dim first, before and after each), the part of an
    asymmetric padding the convolution's own symmetric `padding` cannot express; it keeps x's layout, so
    a channels-last chain stays channels-last through it (passes/layout.py absorbs such pads)."""
    route = FORCE_ROUTE or route
    if route == "dnnl":
        yd = _dnnl_conv(x, w, b, mean, var, gamma, beta, other, eps, stride, padding, dilation, groups, act,
                        pre_pad)  # fmt: skip
        if yd is not None:
            ROUTE_CALLS["dnnl"] += 1
            return yd if channels_last else yd.contiguous()
        route = "onednn"
    if pre_pad and any(pre_pad):
        x = F.pad(x, list(pre_pad))
        PRE_PAD_CALLS["channels_last" if x.is_contiguous(memory_format=_CL) else "other"] += 1
    if route not in ROUTES:
        raise ValueError(f"conv_bn_act: unknown route {route!r} (one of {', '.join(ROUTES)})")
    if route != "aten" and x.dim() != 4:
        route = "aten"  # channels-last is a 4-d memory format
    if route == "onednn" and not onednn_ok(x):
        route = "aten_cl"

    def prepare() -> tuple[torch.Tensor, ...]:
        wf, bf = _bn_fold(w, b, mean, var, gamma, beta, eps)
        bf = None if bf is None else bf.to(w.dtype)
        bias = () if bf is None else (bf,)
        if route == "aten_cl":
            return (wf.contiguous(memory_format=_CL), *bias)
        if route == "onednn":
            try:  # oneDNN's blocked weight layout for this input shape
                packed = torch.ops.mkldnn._reorder_convolution_weight(
                    wf, padding, stride, dilation, groups, list(x.shape)
                )
            except RuntimeError as e:
                log.info("conv_bn_act: oneDNN does not prepack this weight (%s); plain weights", e)
                packed = wf
            return (wf, packed, *bias)
        return (wf, *bias)

    # One cache entry per parameter version, route and (for prepacked weights) input shape: the fold and
    # the packing happen once, and an in-place change to any source tensor is seen on the next call.
    tag = (
        "conv_bn",
        route,
        eps,
        tuple(x.shape) if route == "onednn" else (),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        groups,
    )
    folded = FOLDS.get(tag, [w, b, mean, var, gamma, beta], prepare)
    n_w = 2 if route == "onednn" else 1
    bf = folded[n_w] if len(folded) > n_w else None
    y: torch.Tensor | None = None
    if route == "onednn":
        y = _onednn_conv(x, folded[1], bf, other, stride, padding, dilation, groups, act)
        if y is None:
            route = "aten_cl"
    if y is None:
        wf = folded[0]
        xin = x.contiguous(memory_format=_CL) if route == "aten_cl" else x
        if route == "aten_cl" and not wf.is_contiguous(memory_format=_CL):
            wf = wf.contiguous(memory_format=_CL)
        y = torch.convolution(xin, wf, bf, stride, padding, dilation, False, [0] * len(stride), groups)
        if other is not None:
            y = y.add_(other)
        y = _act_inplace(y, act)
    ROUTE_CALLS[route] += 1
    if channels_last and y.dim() == 4:
        return y.contiguous(memory_format=_CL)
    # The plain route keeps torch's layout (as eager, which follows the input's); the channels-last
    # routes hand the declared NCHW back at the end of a chain.
    return y if route == "aten" and not channels_last else y.contiguous()


def _bn_fold(
    w: torch.Tensor,
    b: torch.Tensor | None,
    mean: torch.Tensor | None,
    var: torch.Tensor | None,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(w', b') of a convolution with its BN folded in: w' in w's dtype, b' in fp32 (the caller rounds
    it to its route's bias type)."""
    if mean is None or var is None:
        return w.contiguous(), None if b is None else b.float()
    # In fp32 whatever the model's dtype: the fold must not add rounding of its own.
    scale = torch.rsqrt(var.float() + eps)
    if gamma is not None:
        scale = scale * gamma.float()
    shift = -mean.float() * scale if b is None else (b.float() - mean.float()) * scale
    if beta is not None:
        shift = shift + beta.float()
    wf = w.float() * scale.reshape((-1,) + (1,) * (w.dim() - 1))
    return wf.to(w.dtype).contiguous(), shift


def _dnnl_conv(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    mean: torch.Tensor | None,
    var: torch.Tensor | None,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    other: torch.Tensor | None,
    eps: float,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    act: str,
    pre_pad: list[int] | tuple[int, ...] | None,
) -> torch.Tensor | None:
    """The "dnnl" route (a channels-last result), or None where it cannot run this call."""
    if x.device.type != "cpu" or x.numel() == 0:
        return None
    prim = dnnl_primitive(tuple(x.shape), x.dtype, w, b, mean, var, gamma, beta, other is not None, eps,
                          stride, padding, dilation, groups, act, pre_pad)  # fmt: skip
    if prim is None:
        return None
    return dnnl_route.run(prim, x, int(w.shape[0]), other)


def dnnl_primitive(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    w: torch.Tensor,
    b: torch.Tensor | None,
    mean: torch.Tensor | None,
    var: torch.Tensor | None,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    residual: bool,
    eps: float,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    act: str,
    pre_pad: list[int] | tuple[int, ...] | None,
) -> Any:
    """The "dnnl" route's primitive (a `ConvPrimitive`) for an input of `shape` and `dtype` and these
    parameters as they are now, or None where the route cannot take the convolution. Also what a
    SuperKernel entry calls its dnnl members with (runtime/super_executor.py)."""
    sources = (w, b, mean, var, gamma, beta)
    # The hot path: this call site's primitive, found by the sources' identities and the call's
    # configuration, valid while every source is the same live tensor at the same address and version
    # (what FOLDS keys by). FOLDS.get builds its key from all of that per call: ~10 us, more than a
    # small depthwise convolution's execution.
    # The weight's shape and dtype too: `.data =` may put a view of the same storage (same address and
    # version counter) behind the same tensor object.
    hot_key = (*map(id, sources), w.shape, w.dtype, shape, dtype, residual, act, eps, groups,
               *stride, *padding, *dilation, None if pre_pad is None else tuple(pre_pad))  # fmt: skip
    hot = _HOT.get(hot_key)
    if hot is not None and _still(hot[0], hot[1], sources):
        return hot[2]
    if not dnnl_route.takes(shape, dtype, w, act) or len(stride) != 2:
        return None
    pads = dnnl_route.pads(padding, pre_pad)
    if pads is None:
        return None

    def prepare() -> tuple[Any, ...]:
        wf, bf = _bn_fold(w, b, mean, var, gamma, beta, eps)
        # None is cached too: oneDNN declined this configuration, so it is not asked again.
        prim = dnnl_route.create(shape, dtype, wf, bf, residual, stride, pads, dilation, groups, act)
        return (prim,)

    # Per parameter version, input shape and dtype and post-op configuration: the primitive holds
    # the reordered weights, so a changed parameter (a new version) creates a new one.
    tag = ("conv_dnnl", eps, shape, dtype, tuple(stride), pads, tuple(dilation), groups, act, residual)
    (prim,) = FOLDS.get(tag, list(sources), prepare)
    if prim is None:
        return None
    _remember(hot_key, sources, prim)
    return prim


# conv_bn_act's "dnnl" primitives by call site (see _dnnl_conv): key -> (weakrefs to the sources, their
# (address, version) when it was stored, the primitive). An entry goes when one of its sources is freed.
_HOT: dict[tuple[Any, ...], tuple[tuple[Any, ...], list[tuple[int, int]], Any]] = {}
_HOT_SIZE = 4096


def _still(
    refs: tuple[Any, ...], stamp: list[tuple[int, int]], sources: tuple[torch.Tensor | None, ...]
) -> bool:
    """Are `sources` the tensors `refs` point at, at the addresses and versions in `stamp`?"""
    now = []
    for t, r in zip(sources, refs, strict=True):
        if t is None:
            if r is not None:
                return False
            continue
        if r is None or r() is not t:
            return False
        now.append((t.data_ptr(), _version(t)))
    return now == stamp


def _remember(key: tuple[Any, ...], sources: tuple[torch.Tensor | None, ...], prim: Any) -> None:
    def forget(_ref: weakref.ReferenceType[torch.Tensor], k: tuple[Any, ...] = key) -> None:
        _HOT.pop(k, None)

    if len(_HOT) >= _HOT_SIZE:
        _HOT.clear()  # parameters passed afresh each call: the slow path (FOLDS) stays correct
    refs = tuple(None if t is None else weakref.ref(t, forget) for t in sources)
    _HOT[key] = (refs, [(t.data_ptr(), _version(t)) for t in sources if t is not None], prim)


def _onednn_conv(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    other: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    act: str,
) -> torch.Tensor | None:
    """oneDNN's fused convolution on channels-last data, or None when it declines this configuration."""
    attr, scalars = _ACT_ONEDNN[act]
    xc = x.contiguous(memory_format=_CL)
    try:
        if other is None:
            return torch.ops.mkldnn._convolution_pointwise(
                xc, packed, bias, padding, stride, dilation, groups, attr, scalars, ""
            )
        if act not in ("none", "relu"):
            return None  # the binary post-op is followed by relu or nothing in this build
        # torch 2.13 fails "add" + relu in bf16 (an internal assert: no add_relu for BFloat16), so there
        # the relu runs in place after oneDNN's convolution + add.
        relu_after = act == "relu" and x.dtype == torch.bfloat16
        # oneDNN's binary post-op: "add" then an optional unary ("sum" is undefined in this build).
        y = torch.ops.mkldnn._convolution_pointwise.binary(
            xc,
            other.contiguous(memory_format=_CL),
            packed,
            bias,
            padding,
            stride,
            dilation,
            groups,
            "add",
            None,
            None if act == "none" or relu_after else attr,
            scalars,
            "",
        )
        return y.relu_() if relu_after else y
    except RuntimeError as e:
        log.info("conv_bn_act: oneDNN declined (%s); torch.convolution instead", str(e).splitlines()[0])
        return None


def _act_inplace(y: torch.Tensor, act: str) -> torch.Tensor:
    # y is the convolution's fresh result: ours to overwrite.
    if act == "relu":
        return y.relu_()
    if act == "relu6":
        return y.clamp_(0.0, 6.0)
    if act == "silu":
        return F.silu(y, inplace=True)
    return _act_torch(y, act)


def _ln_fold(
    w: torch.Tensor, b: torch.Tensor | None, ln_w: torch.Tensor | None, ln_b: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if ln_w is None and ln_b is None:
        return w, b

    def fold() -> tuple[torch.Tensor, ...]:
        wf = w.float()
        bias = b.float() if b is not None else torch.zeros(w.shape[0], dtype=torch.float32)
        if ln_b is not None:
            bias = bias + wf @ ln_b.float()
        if ln_w is not None:
            wf = wf * ln_w.float()
        return wf.to(w.dtype).contiguous(), bias.to(w.dtype)

    wf, bf = FOLDS.get(("ln_linear",), [w, b, ln_w, ln_b], fold)
    return wf, bf


# ---- Linear + GELU as one oneDNN call (the post-op route runtime/linear_post_op.py measures) ----

GELU_ALGORITHM = {"gelu": "none", "gelu_tanh": "tanh"}  # our act name -> oneDNN's gelu algorithm argument
POST_OP_CALLS: Counter[str] = Counter()  # act -> fused calls made (tests check the fused call ran)


def post_op_available(dtype: torch.dtype) -> bool:
    return (
        dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def post_op_takes(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: str) -> bool:
    """Whether `post_op_linear` runs these tensors as one oneDNN call (else the caller runs it unfused)."""
    return (
        act in GELU_ALGORITHM
        and post_op_available(x.dtype)
        and x.dim() >= 2
        and x.is_contiguous()
        and x.numel() > 0
        and w.dim() == 2
        and w.dtype == x.dtype
        and x.shape[-1] == w.shape[1]
        and (b is None or (b.dtype == x.dtype and b.shape == (w.shape[0],)))
    )


def post_op_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: str) -> torch.Tensor:
    """act(F.linear(x, w, b)) as one oneDNN linear with the GELU post-op (callers check `takes`)."""
    k = x.shape[-1]
    m = x.numel() // k
    # One packed copy per weight (its id in the tag): the copy packed for an older version is dropped.
    # The entry's first item is the packed weight; one rebuilt from a package (package/warm.py) also
    # holds the bytes it lies over.
    tag = ("linear_post_op", m, id(w))
    packed = FOLDS.get(tag, [w], lambda: (torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), m),),
                       single=True)[0]  # fmt: skip
    POST_OP_CALLS[act] += 1
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(m, k), packed, b, "gelu", [], GELU_ALGORITHM[act])
    return y.reshape(*x.shape[:-1], w.shape[0])


def linear_act(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    ln_w: torch.Tensor | None,
    ln_b: torch.Tensor | None,
    act: str,
) -> torch.Tensor:
    """act(x @ w.T + b), with a preceding LayerNorm's affine folded into w and b when given.

    GELU (erf or tanh) in fp32/bf16 is one oneDNN linear with the GELU as its post-op, on a weight
    packed once per version (runtime/linear_post_op.py; the pass that makes these calls measured it
    faster per shape). ReLU (and GELU where oneDNN cannot take the tensors) goes through ATen's
    `_addmm_activation` (one call: the GEMM and its epilogue)."""
    w, b = _ln_fold(w, b, ln_w, ln_b)
    if post_op_takes(x, w, b, act):
        return post_op_linear(x, w, b, act)
    k = x.shape[-1]
    if (
        act in ("relu", "gelu")
        and b is not None
        and x.numel() > 0
        and x.dtype in (torch.float32, torch.bfloat16)
    ):
        x2 = x.reshape(-1, k)
        y = torch._addmm_activation(b, x2, w.t(), use_gelu=act == "gelu")
        return y.reshape(*x.shape[:-1], w.shape[0])
    y = F.linear(x, w, b)
    if act == "silu":
        return F.silu(y, inplace=True)
    if act == "relu":
        return y.relu_()
    return _act_torch(y, act)


def linear_residual(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    other: torch.Tensor,
    ln_w: torch.Tensor | None,
    ln_b: torch.Tensor | None,
) -> torch.Tensor:
    """x @ w.T + b + other: the residual is added into the GEMM's fresh output in place (no second
    output buffer, one pass over it)."""
    w, b = _ln_fold(w, b, ln_w, ln_b)
    return F.linear(x, w, b).add_(other)


def _register() -> None:
    try:
        lib = torch.library.Library(NAMESPACE, "DEF")
    except RuntimeError:
        return  # registered already in this process
    lib.define(
        "conv_bn_act(Tensor x, Tensor w, Tensor? b, Tensor? mean, Tensor? var, Tensor? gamma, Tensor? beta, "
        "Tensor? other, float eps, int[] stride, int[] padding, int[] dilation, int groups, "
        'str act, str route="aten", bool channels_last=False, int[]? pre_pad=None) -> Tensor'
    )
    lib.define("linear_act(Tensor x, Tensor w, Tensor? b, Tensor? ln_w, Tensor? ln_b, str act) -> Tensor")
    lib.define(
        "linear_residual(Tensor x, Tensor w, Tensor? b, Tensor other, Tensor? ln_w, Tensor? ln_b) -> Tensor"
    )
    for name, fn in (
        ("conv_bn_act", conv_bn_act),
        ("linear_act", linear_act),
        ("linear_residual", linear_residual),
    ):
        lib.impl(name, fn, "CompositeExplicitAutograd")
        PY_TARGETS[f"{NAMESPACE}.{name}.default"] = fn
    _LIBS.append(lib)  # the registration lives as long as this object


_LIBS: list[Any] = []
_register()
