"""Pass `channels_last_scale` (passes/layout_scale.py): squeeze-and-excitation's per-channel scale
between two channels-last convolutions runs as torch's mul on the NHWC buffer (no kernel writing NCHW,
no conversion back), through the torch route and the ONNX route; values equal eager's and
onnxruntime's, the mul really ran on channels-last data and gave channels-last data, and where a reader
is not a channels-last convolution (NCHW route, a graph output) nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import autofusion
from autofusion.ir import interpret
from autofusion.passes.layout_scale import MUL_TARGET

CL = torch.channels_last


class SqueezeExcite(nn.Module):
    """EfficientNet's block, reduced: depthwise conv + SiLU, SE (mean, 1x1 convs, SiLU, sigmoid), the
    scale, then the projection conv."""

    def __init__(self, c: int, out: int, gate_first: bool = False) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.reduce = nn.Conv2d(c, max(1, c // 4), 1)
        self.expand = nn.Conv2d(max(1, c // 4), c, 1)
        self.project = nn.Conv2d(c, out, 1)
        self.gate_first = gate_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.dw(x))
        s = torch.sigmoid(self.expand(torch.nn.functional.silu(self.reduce(h.mean((2, 3), keepdim=True)))))
        return self.project(s * h if self.gate_first else h * s)


class ScaleAlsoOut(SqueezeExcite):
    """The scaled activation is a graph output too: its reader is not only a convolution."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        h = torch.nn.functional.silu(self.dw(x))
        s = torch.sigmoid(self.expand(self.reduce(h.mean((2, 3), keepdim=True))))
        y = h * s
        return self.project(y), y


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """(input channels-last, result channels-last) of every call of the pass's mul."""
    seen: list[tuple[bool, bool]] = []
    real = torch.ops.aten.mul.Tensor

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = real(a, b)
        seen.append((a.is_contiguous(memory_format=CL), y.is_contiguous(memory_format=CL)))
        return y

    monkeypatch.setitem(interpret.PY_TARGETS, MUL_TARGET, spy)
    return seen


def _muls(cm: autofusion.CompiledModel) -> list[tuple[int, ...]]:
    g = cm.compiled.program.plan.graph
    return [n.out.type.strides for n in g.nodes if n.op == "extern" and n.attr("target") == MUL_TARGET]


@pytest.mark.parametrize("layout", ["dnnl", "channels_last"])
@pytest.mark.parametrize(("batch", "c", "hw", "gate_first"), [(1, 12, 9, False), (2, 8, 7, True)])
def test_the_scale_stays_channels_last(
    monkeypatch: pytest.MonkeyPatch, layout: str, batch: int, c: int, hw: int, gate_first: bool
) -> None:
    seen = _spy(monkeypatch)
    torch.manual_seed(0)
    m = SqueezeExcite(c, 5, gate_first).eval()
    x = torch.randn(batch, c, hw, hw)
    with torch.no_grad():
        cm = autofusion.compile(m, (x,), conv_layout=layout)
        got = cm(x)
        ref = m(x)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    (strides,) = _muls(cm)
    assert strides == (hw * hw * c, 1, hw * c, c)  # declared NHWC
    assert seen and all(seen), seen  # ran on NHWC data, gave NHWC data
    assert got.is_contiguous()  # the graph output keeps eager's layout


def test_half_precision_on_the_channels_last_route(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy(monkeypatch)
    torch.manual_seed(0)
    m = SqueezeExcite(16, 8).eval()
    x = torch.randn(1, 16, 11, 11)
    with torch.no_grad():
        ref = m(x)
        cm = autofusion.compile(m.half(), (x.half(),), conv_layout="channels_last")
        got = cm(x.half())
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
    assert len(_muls(cm)) == 1 and seen and all(seen)


def test_nchw_route_and_other_readers_leave_the_mul_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 8, 9, 9)
    with torch.no_grad():
        m = SqueezeExcite(8, 4).eval()
        cm = autofusion.compile(m, (x,), conv_layout="nchw")
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
        assert _muls(cm) == []
        both = ScaleAlsoOut(8, 4).eval()
        cm2 = autofusion.compile(both, (x,), conv_layout="dnnl")
        for a, b in zip(cm2(x), both(x), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert _muls(cm2) == []
        off = autofusion.compile(m, (x,), conv_layout="dnnl", disabled=["channels_last_scale"])
        torch.testing.assert_close(off(x), m(x), rtol=1e-4, atol=1e-5)
        assert _muls(off) == []


def test_the_onnx_route_equals_onnxruntime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    seen = _spy(monkeypatch)
    torch.manual_seed(0)
    m = SqueezeExcite(12, 6).eval()
    x = torch.randn(2, 12, 13, 13)
    path = tmp_path / "se.onnx"
    with torch.no_grad():
        torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    cm = autofusion.compile(str(path), conv_layout="dnnl")
    got = cm(x)
    torch.testing.assert_close(got, torch.from_numpy(ref), rtol=1e-4, atol=1e-5)
    assert len(_muls(cm)) == 1 and seen and all(seen)
