"""Convolutions on the fast route: `padding='same'` convolutions become plain `conv` nodes (so the rules
fold their BatchNorm and activation and the layout pass routes them), and an asymmetric zero padding in
front of a convolution (TF-style "same" padding, as MobileNetV2 and EfficientNet write it) is absorbed
into a channels-last chain instead of breaking it. Values equal eager's (fp32; odd sizes, stride 2,
groups, dilation, batch 1 and 3, non-contiguous inputs); each test proves the route ran
(ROUTE_CALLS / PRE_PAD_CALLS count what really ran)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autofusion
from autofusion.passes import layout
from autofusion.passes.layout_timing import ChainTiming
from autofusion.runtime import dnnl_route, library

ONEDNN = torch.backends.mkldnn.is_available()
ROUTES = ["aten_cl", "onednn"] if ONEDNN else ["aten_cl"]


def _favour(route: str):
    """A timer under which `route` wins every chain (the real one depends on the machine and its load)."""
    s = {r: (1e-3 if r == route else 2e-3) for r in ("aten", "aten_cl", "onednn")}
    return lambda spec: ChainTiming(s)


def _bn(c: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn.eval()


def _input(batch: int, c: int, h: int, w: int, contiguous: bool) -> torch.Tensor:
    if contiguous:
        return torch.randn(batch, c, h, w)
    # a strided view: every other column of a wider tensor, channels innermost
    return torch.randn(batch, h, 2 * w, c).permute(0, 3, 1, 2)[..., ::2]


def _ran(before: dict[str, int], counter: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in counter.items() if v - before.get(k, 0)}


def _ops(cm: object) -> list[str]:
    graph = cm.compiled.program.plan.graph  # type: ignore[attr-defined]
    return [n.attr("target") if n.op == "extern" else n.op.value for n in graph.nodes]


class SameConv(nn.Module):
    def __init__(self, k: int | tuple[int, int], d: int | tuple[int, int], groups: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, k, padding="same", dilation=d, groups=groups, bias=False)
        self.bn = _bn(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.bn(self.conv(x)))


SAME = {  # kernel, dilation, groups
    "3x3": (3, 1, 1),
    "depthwise5x5": (5, 1, 8),
    "even4x4": (4, 1, 1),  # odd total: one extra element after, as an explicit pad
    "dilated-depthwise": (3, 2, 8),
    "even-dilated-groups": (2, 3, 2),
    "rect-mixed": ((3, 4), (1, 2), 1),
}


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", sorted(SAME))
def test_same_padding_is_a_plain_convolution(case: str, batch: int, contiguous: bool) -> None:
    torch.manual_seed(0)
    k, d, g = SAME[case]
    model = SameConv(k, d, g).eval()
    x = _input(batch, 8, 11, 9, contiguous)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        got, ref = cm(x), model(x)
    ops = _ops(cm)
    # BN and SiLU folded into one library convolution; no ATen conv2d extern left
    assert ops.count("autofusion_rules.conv_bn_act.default") == 1, ops
    assert not [o for o in ops if "conv2d" in o or o == "conv"], ops
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("route", ROUTES)
def test_same_padding_convolutions_are_routed(route: str, monkeypatch) -> None:
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    torch.manual_seed(0)
    model = nn.Sequential(SameConv(3, 1, 1), SameConv(5, 1, 8), SameConv(4, 1, 1)).eval()
    x = torch.randn(3, 8, 13, 10)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        before = dict(library.ROUTE_CALLS)
        got, ref = cm(x), model(x)
    assert _ran(before, library.ROUTE_CALLS) == {route: 3}
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_strided_same_padding_is_refused_as_torch_does() -> None:
    with pytest.raises(RuntimeError):
        nn.functional.conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), padding="same", stride=2)


class TFPadded(nn.Module):
    """A pointwise conv, then TF-style asymmetric padding before a stride-2 depthwise conv (MobileNetV2's
    and EfficientNet's downsampling), then a pointwise conv with a residual-free BN, as those nets do."""

    def __init__(self, pads: tuple[int, int, int, int], k: int, stride: int) -> None:
        super().__init__()
        self.expand, self.b1 = nn.Conv2d(4, 12, 1, bias=False), _bn(12)
        self.pad = nn.ZeroPad2d(pads)
        self.dw, self.b2 = nn.Conv2d(12, 12, k, stride=stride, groups=12, bias=False), _bn(12)
        self.project, self.b3 = nn.Conv2d(12, 6, 1, bias=False), _bn(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.relu6(self.b1(self.expand(x)))
        y = nn.functional.relu6(self.b2(self.dw(self.pad(y))))
        return self.b3(self.project(y))


PADS = {  # F.pad order (left, right, top, bottom), kernel, stride
    "tf-s2-k3": ((0, 1, 0, 1), 3, 2),
    "tf-s2-k5": ((1, 2, 1, 2), 5, 2),
    "one-side-s1": ((0, 2, 1, 0), 3, 1),
    "mixed": ((2, 1, 0, 3), 3, 2),
}


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", sorted(PADS))
@pytest.mark.parametrize("route", ROUTES)
def test_asymmetric_pad_joins_a_channels_last_chain(
    route: str, case: str, batch: int, contiguous: bool, monkeypatch
) -> None:
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    torch.manual_seed(0)
    pads, k, s = PADS[case]
    model = TFPadded(pads, k, s).eval()
    x = _input(batch, 4, 15, 11, contiguous)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        before, pre = dict(library.ROUTE_CALLS), dict(library.PRE_PAD_CALLS)
        got, ref = cm(x), model(x)
    ops = _ops(cm)
    assert "pad" not in ops, ops  # absorbed: the chain is not broken by a pad kernel
    assert _ran(before, library.ROUTE_CALLS) == {route: 3}
    assert _ran(pre, library.PRE_PAD_CALLS) == {"channels_last": 1}  # padded in the chain's layout
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    if contiguous:  # (eager's result follows a channels-last-like input's layout; ours is NCHW then)
        assert got.stride() == ref.stride()


def test_asymmetric_pad_stays_a_pad_on_the_plain_route(monkeypatch) -> None:
    """NCHW chains keep the pad node (fusion may merge it with the elementwise work before it)."""
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour("aten"))
    torch.manual_seed(0)
    model = TFPadded((0, 1, 0, 1), 3, 2).eval()
    x = torch.randn(1, 4, 12, 12)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        pre = dict(library.PRE_PAD_CALLS)
        got, ref = cm(x), model(x)
    assert "pad" in _ops(cm)
    assert not _ran(pre, library.PRE_PAD_CALLS)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


class PadFeedsTwo(nn.Module):
    """One asymmetric padding read by two convolutions (and a symmetric one before a third)."""

    def __init__(self) -> None:
        super().__init__()
        self.c0 = nn.Conv2d(3, 8, 3, padding=1)
        self.a = nn.Conv2d(8, 8, 3, stride=2, groups=4)
        self.b = nn.Conv2d(8, 8, 2, dilation=2)
        self.c = nn.Conv2d(8, 8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.c0(x)
        p = nn.functional.pad(y, (1, 2, 0, 1))
        return self.a(p), self.b(p), self.c(nn.functional.pad(y, (1, 1, 1, 1)))


@pytest.mark.parametrize("route", ROUTES)
def test_a_padding_read_by_several_convolutions(route: str, monkeypatch) -> None:
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    torch.manual_seed(0)
    model = PadFeedsTwo().eval()
    x = torch.randn(3, 3, 10, 13)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        before, pre = dict(library.ROUTE_CALLS), dict(library.PRE_PAD_CALLS)
        outs, refs = cm(x), model(x)
    assert "pad" not in _ops(cm)
    assert _ran(before, library.ROUTE_CALLS) == {route: 4}
    assert _ran(pre, library.PRE_PAD_CALLS) == {"channels_last": 2}
    for o, r in zip(outs, refs, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-5)
        assert o.stride() == r.stride()


def test_an_absorbed_pad_exports_to_onnx(monkeypatch) -> None:
    """A routed call with a pre-pad exports as one Conv with per-side pads; onnxruntime agrees."""
    import onnx
    import onnxruntime as ort

    from autofusion.export.onnx import export_graph

    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour("aten_cl"))
    torch.manual_seed(0)
    model = TFPadded((1, 2, 0, 1), 3, 2).eval()
    x = torch.randn(1, 4, 13, 12)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        ref = model(x)
    cg = cm.last
    graph = cg.program.plan.graph  # type: ignore[union-attr]
    routed = [n for n in graph.nodes if n.op == "extern" and "conv_bn_act" in n.attr("target")]
    assert sorted(len(n.attr("args")) for n in routed) == [16, 16, 17]
    bindings = zip(cg.graph.inputs, cg.captured.bindings, strict=True)  # type: ignore[union-attr]
    weights, feeds = {}, {}
    for gi, (kind, v) in bindings:
        if kind == "bound":
            weights[gi.name] = v
        else:
            feeds[gi.name] = x.numpy()
    exported = export_graph(graph, weights=weights)
    onnx.checker.check_model(exported, full_check=True)
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, feeds)
    torch.testing.assert_close(torch.from_numpy(got), ref, rtol=1e-4, atol=1e-5)


class ResidualOfAConv(nn.Module):
    """MobileNetV2's first residual block of a stage: `r + bn(conv(...r...))` where `r` is itself a
    conv + BN result read by the block too (so it cannot take the add; the block's last conv can)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(4, 8, 1, bias=False), _bn(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), _bn(8)
        self.c3, self.b3 = nn.Conv2d(8, 8, 1, bias=False), _bn(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.b1(self.c1(x))
        y = nn.functional.relu6(self.b2(self.c2(r)))
        return r + self.b3(self.c3(y))


@pytest.mark.parametrize("route", ["aten", *ROUTES])
def test_a_residual_read_elsewhere_fuses_into_the_other_convolution(route: str, monkeypatch) -> None:
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    torch.manual_seed(0)
    model = ResidualOfAConv().eval()
    x = torch.randn(3, 4, 9, 7)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        before = dict(library.ROUTE_CALLS)
        got, ref = cm(x), model(x)
    ops = _ops(cm)
    assert ops == ["autofusion_rules.conv_bn_act.default"] * 3, ops  # the add went into the last call
    assert _ran(before, library.ROUTE_CALLS) == {route: 3}
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_an_absorbed_pad_survives_save_and_load(tmp_path, monkeypatch) -> None:
    """A package keeps the pre-pad literal: the loaded model pads as the compiled one did."""
    route = ROUTES[-1]
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    torch.manual_seed(0)
    model = TFPadded((0, 1, 0, 1), 3, 2).eval()
    x = torch.randn(3, 4, 14, 13)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        ref = model(x)
        cm(x)
        autofusion.save(cm, tmp_path / "tf.afpkg", weights="copy")
        loaded = autofusion.load(tmp_path / "tf.afpkg")
        pre = dict(library.PRE_PAD_CALLS)
        got = loaded(x)
    assert _ran(pre, library.PRE_PAD_CALLS) == {"channels_last": 1}
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


class OddPad(nn.Module):
    """A padding no convolution can take as its own before a strided grouped conv: a non-zero constant
    and/or a negative (cropping) side."""

    def __init__(self, pads: tuple[int, int, int, int], value: float) -> None:
        super().__init__()
        self.pads, self.value = pads, value
        self.c0, self.b0 = nn.Conv2d(3, 8, 3, padding=1, bias=False), _bn(8)
        self.a = nn.Conv2d(8, 8, 3, stride=2, groups=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.relu6(self.b0(self.c0(x)))
        return self.a(nn.functional.pad(y, self.pads, value=self.value))


ODD_PADS = {
    "value": ((0, 1, 0, 1), 0.5),
    "negative": ((-1, 0, 0, 1), 0.0),
    "negative-value": ((0, -1, 1, 0), -2.0),
    "symmetric-value": ((1, 1, 1, 1), 3.0),
}
LAYOUTS = {"aten_cl": "channels_last", "onednn": "blocked", "dnnl": "dnnl"}


@pytest.mark.parametrize("case", sorted(ODD_PADS))
@pytest.mark.parametrize("route", [*ROUTES, *(["dnnl"] if dnnl_route.available() else [])])
def test_a_padding_with_a_value_or_a_crop_is_never_absorbed(route: str, case: str) -> None:
    """Only zero, non-negative paddings become a convolution's own: with a constant (here also negative)
    or a cropping side the pad stays a step of its own and no call pads its input itself; the
    convolutions still run the forced route and the result equals eager's (batch 3, odd sizes)."""
    torch.manual_seed(0)
    pads, value = ODD_PADS[case]
    model = OddPad(pads, value).eval()
    x = torch.randn(3, 3, 13, 10)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,), conv_layout=LAYOUTS[route])
        before, pre = dict(library.ROUTE_CALLS), dict(library.PRE_PAD_CALLS)
        got, ref = cm(x), model(x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    assert not _ran(pre, library.PRE_PAD_CALLS)
    graph = cm.compiled.program.plan.graph
    calls = [
        n for n in graph.nodes if n.op == "extern" and str(n.attr("target")).endswith("conv_bn_act.default")
    ]
    assert calls and all(len(n.attr("args")) < 17 or not n.attr("args")[16] for n in calls)
    assert _ran(before, library.ROUTE_CALLS).get(route, 0) >= 1, _ran(before, library.ROUTE_CALLS)
