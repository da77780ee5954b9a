"""Convolution routes (runtime/library.py's conv_bn_act: aten, aten_cl, onednn) and the layout pass that
picks them per chain (passes/layout.py): values equal eager's, the chosen route really ran (ROUTE_CALLS
counts what ran, a declined oneDNN call counts as its fallback), results have the layout their type
declares, outputs keep eager's strides, and a parameter changed in place between calls is seen."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import autofusion
from autofusion.passes import layout
from autofusion.passes.layout_timing import ChainTiming
from autofusion.runtime import library

ONEDNN = torch.backends.mkldnn.is_available()
op = torch.ops.autofusion_rules.conv_bn_act

# (in channels, out channels, kernel, stride, padding, dilation, groups, H, W)
SHAPES = {
    "odd-hw": (3, 5, 3, 1, 1, 1, 1, 9, 7),
    "stride2-pad": (4, 6, 3, 2, 1, 1, 1, 11, 10),
    "nopad": (4, 6, 3, 1, 0, 1, 1, 8, 8),
    "groups2": (4, 6, 3, 1, 1, 1, 2, 7, 9),
    "depthwise": (8, 8, 3, 1, 1, 1, 8, 13, 11),
    "depthwise7x7": (8, 8, 7, 1, 3, 1, 8, 14, 14),
    "depthwise-s2": (8, 8, 3, 2, 1, 1, 8, 15, 15),
    "dilated": (4, 4, 3, 1, 2, 2, 1, 10, 9),
    "pointwise": (6, 10, 1, 1, 0, 1, 1, 5, 5),
}


def _route_ran(route: str, before: dict[str, int]) -> None:
    ran = {k: v - before.get(k, 0) for k, v in library.ROUTE_CALLS.items() if v - before.get(k, 0)}
    assert ran == {route: 1}, f"asked for {route}, ran {ran}"


def _tol(dt: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-4, "atol": 1e-4} if dt == torch.float32 else {"rtol": 4e-2, "atol": 4e-2}


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("post", ["bn-relu", "bn-add-relu", "bias-relu6", "bn-silu", "plain"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("route", ["aten", "aten_cl", "onednn"])
def test_route_equals_eager(route: str, shape: str, post: str, dt: torch.dtype) -> None:
    if route == "onednn" and not ONEDNN:
        pytest.skip("this torch build has no oneDNN")
    ci, co, k, s, p, d, g, h, w_ = SHAPES[shape]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, ci, h, w_, generator=gen).to(dt)
    w = (torch.randn(co, ci // g, k, k, generator=gen) * 0.3).to(dt)
    b = torch.randn(co, generator=gen).to(dt) if post == "bias-relu6" else None
    bn = post.startswith("bn")
    mean, var = torch.randn(co, generator=gen).to(dt), (torch.rand(co, generator=gen) + 0.5).to(dt)
    gamma, beta = torch.randn(co, generator=gen).to(dt), torch.randn(co, generator=gen).to(dt)
    acts = {"bn-relu": "relu", "bn-add-relu": "relu", "bias-relu6": "relu6", "bn-silu": "silu"}
    act = acts.get(post, "none")
    ref = torch.nn.functional.conv2d(x, w, b, s, p, d, g)
    if bn:
        ref = torch.nn.functional.batch_norm(ref, mean, var, gamma, beta, False, 0.0, 1e-5)
    other = torch.randn(ref.shape, generator=gen).to(dt) if post == "bn-add-relu" else None
    if other is not None:
        ref = ref + other
    ref = {"relu": torch.relu, "relu6": lambda t: t.clamp(0, 6), "silu": torch.nn.functional.silu}.get(
        act, lambda t: t
    )(ref)
    for cl in (False, True):
        before = dict(library.ROUTE_CALLS)
        args = (mean, var, gamma, beta) if bn else (None, None, None, None)
        y = op(x, w, b, *args, other, 1e-5, [s, s], [p, p], [d, d], g, act, route, cl)
        _route_ran(route, before)
        torch.testing.assert_close(y.float(), ref.float(), **_tol(dt))
        if cl:
            assert y.is_contiguous(memory_format=torch.channels_last)
        elif route != "aten":
            assert y.is_contiguous()


def test_a_weight_changed_in_place_is_seen() -> None:
    """The fold and the oneDNN prepacking are cached per parameter version: an in-place change to the
    weight or to a BatchNorm statistic makes the next call fold and pack again."""
    for route in ("aten_cl", "onednn") if ONEDNN else ("aten_cl",):
        gen = torch.Generator().manual_seed(1)
        x, w = torch.randn(1, 4, 8, 8, generator=gen), torch.randn(6, 4, 3, 3, generator=gen)
        mean, var = torch.zeros(6), torch.ones(6)

        def call(route: str, x=x, w=w, mean=mean, var=var) -> torch.Tensor:
            args = (x, w, None, mean, var, None, None, None, 0.0, [1, 1], [1, 1], [1, 1], 1, "none")
            return op(*args, route, True)

        first = call(route)
        misses = library.FOLDS.misses
        torch.testing.assert_close(call(route), first)
        assert library.FOLDS.misses == misses  # cached: no second fold
        with torch.no_grad():
            w.mul_(2.0)
        torch.testing.assert_close(call(route), first * 2, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            mean.add_(1.0)
        want = torch.nn.functional.conv2d(x, w, None, 1, 1) - 1.0
        torch.testing.assert_close(call(route), want, rtol=1e-5, atol=1e-5)


class Block(nn.Module):
    """A ResNet basic block with a downsampling shortcut, a depthwise stage and TF-style padding."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.cs, self.bs = nn.Conv2d(4, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8)
        self.dw, self.bd = nn.Conv2d(8, 8, 3, groups=8, bias=False), nn.BatchNorm2d(8)
        self.pw = nn.Conv2d(8, 6, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + self.bs(self.cs(x)))
        z = torch.nn.functional.relu6(self.bd(self.dw(torch.nn.functional.pad(y, (1, 1, 1, 1)))))
        return self.pw(z), z.sigmoid()  # a routed result read by a fused kernel, and one handed back


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = Block().eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m


def _favour(route: str):
    """A timer under which `route` wins every chain (the real one depends on the machine and its load)."""
    s = {r: (1e-3 if r == route else 2e-3) for r in ("aten", "aten_cl", "onednn")}
    return lambda spec: ChainTiming(s)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("route", ["aten_cl", "onednn"])
def test_a_network_runs_channels_last_end_to_end(route: str, dt: torch.dtype, monkeypatch) -> None:
    if route == "onednn" and not ONEDNN:
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    model = _model().to(dt)
    x = torch.randn(2, 4, 17, 15).to(dt)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        before = dict(library.ROUTE_CALLS)
        outs, refs = cm(x), model(x)
    ran = {k: v - before.get(k, 0) for k, v in library.ROUTE_CALLS.items() if v - before.get(k, 0)}
    assert ran == {route: 5}, ran  # every convolution, none fell back
    assert "channels_last" in cm.stats["passes"]
    graph = cm.compiled.program.plan.graph  # type: ignore[union-attr]
    routed = [n for n in graph.nodes if n.op == "extern" and "conv_bn_act" in n.attr("target")]
    assert not [n for n in graph.nodes if n.op in ("conv", "pad")]  # the symmetric pad was absorbed
    inside = [n for n in routed if n.out.id not in graph.outputs]
    assert inside and all(n.attr("args")[-1] is True and not n.out.type.is_contiguous for n in inside)
    for o, r in zip(outs, refs, strict=True):
        torch.testing.assert_close(o.float(), r.float(), **_tol(dt))
        assert o.stride() == r.stride()


def test_parameters_changed_between_calls_are_seen(monkeypatch) -> None:
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour("onednn" if ONEDNN else "aten_cl"))
    model = _model()
    x = torch.randn(1, 4, 16, 16)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)
        model.c2.weight.mul_(-1.5)
        model.b1.running_var.mul_(3.0)
        model.pw.bias.add_(1.0)
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)


def test_the_onnx_route_gets_the_same_treatment(monkeypatch) -> None:
    route = "onednn" if ONEDNN else "aten_cl"
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    model = _model()
    x = torch.randn(1, 4, 16, 16)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17)
    with torch.no_grad():
        cm = autofusion.compile(buf.getvalue())
        before = dict(library.ROUTE_CALLS)
        outs, refs = cm(x), model(x)
    assert library.ROUTE_CALLS[route] - before.get(route, 0) == 5
    # (the exporter folds each BatchNorm into its Conv: plain convolutions, routed all the same)
    assert not [n for n in cm.compiled.program.plan.graph.nodes if n.op == "conv"]  # type: ignore[union-attr]
    for o, r in zip(outs, refs, strict=True):
        torch.testing.assert_close(torch.as_tensor(o), r, rtol=1e-4, atol=1e-4)


class ThroughTorchOps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.c2(self.c1(x))
        return torch.nn.functional.max_pool2d(y, 2), y.permute(0, 2, 3, 1), y.flatten(1)


@pytest.mark.parametrize("route", ["aten_cl", "onednn"])
def test_results_passed_on_by_torch_ops_keep_eager_strides(route: str, monkeypatch) -> None:
    """A chain's last result read by a torch op (a pooling, a view) that is a graph output comes back
    NCHW, so the caller sees eager's strides."""
    if route == "onednn" and not ONEDNN:
        pytest.skip("this torch build has no oneDNN")
    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour(route))
    torch.manual_seed(0)
    model = ThroughTorchOps().eval()
    x = torch.randn(2, 3, 9, 10)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        before = dict(library.ROUTE_CALLS)
        outs, refs = cm(x), model(x)
    assert library.ROUTE_CALLS[route] - before.get(route, 0) == 2
    for o, r in zip(outs, refs, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)
        assert o.stride() == r.stride()


def test_a_routed_graph_exports_to_onnx(monkeypatch) -> None:
    """Routed calls (plain convolutions without BN among them) keep their ONNX expansion: the route and
    the layout change no value, so onnxruntime computes what eager does."""
    import onnx
    import onnxruntime as ort

    from autofusion.export.onnx import export_graph

    monkeypatch.setattr(layout, "timer_for", lambda cache: _favour("aten_cl"))
    model = _model()
    x = torch.randn(1, 4, 16, 16)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        refs = model(x)
    cg = cm.last
    graph = cg.program.plan.graph  # type: ignore[union-attr]
    routed = [n for n in graph.nodes if n.op == "extern" and "conv_bn_act" in n.attr("target")]
    assert len(routed) == 5 and all(len(n.attr("args")) == 16 for n in routed)
    weights = {gi.name: v for gi, (kind, v) in zip(cg.graph.inputs, cg.captured.bindings, strict=True)
               if kind == "bound"}  # type: ignore[union-attr]  # fmt: skip
    feeds = {gi.name: x.numpy() for gi, (kind, _) in zip(cg.graph.inputs, cg.captured.bindings, strict=True)
             if kind != "bound"}  # type: ignore[union-attr]  # fmt: skip
    exported = export_graph(graph, weights=weights)
    onnx.checker.check_model(exported, full_check=True)
    sess = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, r in zip(sess.run(None, feeds), refs, strict=True):
        np_ref = r.numpy()
        assert got.shape == np_ref.shape
        torch.testing.assert_close(torch.from_numpy(got), r, rtol=1e-4, atol=1e-4)
