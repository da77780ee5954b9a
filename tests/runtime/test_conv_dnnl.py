"""conv_bn_act's "dnnl" route (runtime/dnnl_route.py, codegen/cpp/dnnl_conv.cpp): oneDNN convolutions with
primitives created once. Values equal conv2d + BN + activation (+ residual) in fp32 and bf16 on odd
shapes, the route really ran (ROUTE_CALLS), results survive later calls, a changed parameter creates a
new primitive, one OpenMP runtime serves torch and oneDNN, a missing library or compiler falls back to
the "onednn" route with one logged reason, and a whole zoo CNN runs on it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import autofusion
from autofusion.codegen.cpp import dnnl_conv
from autofusion.passes import layout
from autofusion.runtime import dnnl_route, library

MISSING = "oneDNN (onednn-cpu-gomp, onednn-devel-cpu-gomp) is not installed"
pytestmark = pytest.mark.skipif(isinstance(dnnl_conv.find_install(), str), reason=MISSING)
op = torch.ops.autofusion_rules.conv_bn_act

# (in channels, out channels, kernel, stride, padding, dilation, groups, H, W, pre_pad)
SHAPES = {
    "odd-c20": (20, 24, 3, 1, 1, 1, 1, 9, 7, None),
    "7x7-s2": (3, 10, 7, 2, 3, 1, 1, 23, 21, None),
    "1x1": (17, 33, 1, 1, 0, 1, 1, 6, 5, None),
    "depthwise3x3": (24, 24, 3, 1, 1, 1, 24, 13, 11, None),
    "depthwise-s2": (19, 19, 3, 2, 1, 1, 19, 15, 15, None),
    "depthwise5x5": (8, 8, 5, 1, 2, 1, 8, 14, 14, None),
    "grouped": (12, 18, 3, 1, 1, 1, 3, 7, 9, None),
    "stride2-nopad": (4, 6, 3, 2, 0, 1, 1, 11, 10, None),
    "dilated2": (5, 7, 3, 1, 2, 2, 1, 10, 9, None),
    "asym-pad": (6, 8, 3, 2, 0, 1, 1, 12, 11, (0, 1, 0, 1)),  # TF 'same' with stride 2
    "asym-pad-dw": (8, 8, 3, 2, 0, 1, 8, 12, 12, (1, 2, 0, 1)),
}
ACTS = {
    "none": lambda t: t,
    "relu": torch.relu,
    "relu6": lambda t: t.clamp(0, 6),
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
}


def _tol(dt: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-4, "atol": 1e-4} if dt == torch.float32 else {"rtol": 4e-2, "atol": 6e-2}


def _ran(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in library.ROUTE_CALLS.items() if v - before.get(k, 0)}


def _case(shape: str, dt: torch.dtype, bn: bool, bias: bool, residual: bool, seed: int = 0):
    ci, co, k, s, p, d, g, h, w_, pre = SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, ci, h, w_, generator=gen).to(dt)
    w = (torch.randn(co, ci // g, k, k, generator=gen) * 0.3).to(dt)
    b = torch.randn(co, generator=gen).to(dt) if bias else None
    stats = (
        torch.randn(co, generator=gen).to(dt),
        (torch.rand(co, generator=gen) + 0.5).to(dt),
        torch.randn(co, generator=gen).to(dt),
        torch.randn(co, generator=gen).to(dt),
    )
    ref = F.conv2d(F.pad(x, list(pre)) if pre else x, w, b, s, p, d, g)
    if bn:
        ref = F.batch_norm(ref, stats[0], stats[1], stats[2], stats[3], False, 0.0, 1e-5)
    other = torch.randn(ref.shape, generator=gen).to(dt) if residual else None
    if other is not None:
        ref = ref + other
    args = (x, w, b, *(stats if bn else (None,) * 4), other, 1e-5, [s, s], [p, p], [d, d], g)
    return args, ref, pre


# Every activation with BN, with and without the residual; the other post-ops with relu and none.
POSTS = [(p, a) for p in ("bn", "bn-add") for a in sorted(ACTS)] + [
    (p, a) for p in ("bias", "bias-add", "plain") for a in ("none", "relu")
]


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("post", "act"), POSTS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_dnnl_equals_eager(shape: str, post: str, act: str, dt: torch.dtype) -> None:
    args, ref, pre = _case(shape, dt, post.startswith("bn"), post.startswith("bias"), "add" in post)
    ref = ACTS[act](ref.float())
    for cl in (False, True):
        before = dict(library.ROUTE_CALLS)
        y = op(*args, act, "dnnl", cl, pre)
        assert _ran(before) == {"dnnl": 1}
        torch.testing.assert_close(y.float(), ref, **_tol(dt))
        assert y.dtype == dt
        assert y.is_contiguous(memory_format=torch.channels_last) if cl else y.is_contiguous()


@pytest.mark.parametrize("act", ["sigmoid", "hardswish", "gelu", "relu6"])
def test_the_glue_takes_every_activation_and_asymmetric_padding(act: str) -> None:
    """Straight through ConvPrimitive: activations the rules do not produce yet, padding (t, l, b, r)."""
    glue = dnnl_route.glue()
    assert glue is not None
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 5, 9, 8, generator=gen).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(7, 5, 3, 3, generator=gen), torch.randn(7, generator=gen)
    prim = dnnl_conv.ConvPrimitive(glue, "float32", 1, 5, 9, 8, 7, 3, 3, (2, 1), (1, 0, 2, 3), (1, 2), 1,
                                   w.data_ptr(), b.data_ptr(), act, False)  # fmt: skip
    y = torch.empty(1, 7, prim.oh, prim.ow).contiguous(memory_format=torch.channels_last)
    prim.execute(x.data_ptr(), y.data_ptr())
    ref = F.conv2d(F.pad(x, [0, 3, 1, 2]), w, b, (2, 1), 0, (1, 2))
    fns = {"sigmoid": torch.sigmoid, "hardswish": F.hardswish, "gelu": F.gelu, "relu6": ACTS["relu6"]}
    torch.testing.assert_close(y, fns[act](ref), rtol=1e-4, atol=1e-4)
    assert prim.impl  # oneDNN names the implementation it picked
    with pytest.raises(dnnl_conv.DnnlError, match="residual"):
        prim.execute(x.data_ptr(), y.data_ptr(), x.data_ptr())


def test_results_survive_later_calls_and_inputs_may_be_strided() -> None:
    args, ref, _ = _case("odd-c20", torch.float32, True, False, True)
    x, rest = args[0], args[1:]
    first = op(x, *rest, "relu", "dnnl", True)
    x2 = torch.randn_like(x)
    second = op(x2, *rest, "relu", "dnnl", True)
    torch.testing.assert_close(first, torch.relu(ref), rtol=1e-4, atol=1e-4)  # not overwritten
    assert first.data_ptr() != second.data_ptr()
    # A non-contiguous input (a strided slice of a wider map) and a transposed residual.
    wide = torch.randn(2, 20, 9, 14)
    xs = wide[:, :, :, ::2]
    other = rest[6]
    other_t = other.transpose(2, 3).contiguous().transpose(2, 3)
    before = dict(library.ROUTE_CALLS)
    y = op(xs, *rest[:6], other_t, *rest[7:], "relu", "dnnl", False)
    assert _ran(before) == {"dnnl": 1}
    w, b, mean, var, gamma, beta = rest[:6]
    want = F.batch_norm(F.conv2d(xs, w, b, 1, 1), mean, var, gamma, beta, False, 0.0, 1e-5) + other
    torch.testing.assert_close(y, torch.relu(want), rtol=1e-4, atol=1e-4)


def test_a_changed_parameter_creates_a_new_primitive() -> None:
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 4, 8, 8, generator=gen), torch.randn(6, 4, 3, 3, generator=gen)
    mean, var = torch.zeros(6), torch.ones(6)

    def call() -> torch.Tensor:
        attrs = ([1, 1], [1, 1], [1, 1], 1, "none", "dnnl", True)
        return op(x, w, None, mean, var, None, None, None, 0.0, *attrs)

    first = call()
    misses = library.FOLDS.misses
    torch.testing.assert_close(call(), first)
    assert library.FOLDS.misses == misses  # the primitive was reused
    with torch.no_grad():
        w.mul_(2.0)
    torch.testing.assert_close(call(), first * 2, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        mean.add_(1.0)
    torch.testing.assert_close(call(), F.conv2d(x, w, None, 1, 1) - 1.0, rtol=1e-5, atol=1e-5)
    # New storage behind the same tensor object (`.data =`, which may reset the version): seen too.
    w.data = torch.randn(6, 4, 3, 3, generator=gen)
    torch.testing.assert_close(call(), F.conv2d(x, w, None, 1, 1) - 1.0, rtol=1e-5, atol=1e-5)
    # Another input shape is another primitive (never a primitive created for other dims).
    x3 = torch.randn(3, 4, 5, 7, generator=gen)
    y3 = op(x3, w, None, mean, var, None, None, None, 0.0, [1, 1], [1, 1], [1, 1], 1, "none", "dnnl", True)
    torch.testing.assert_close(y3, F.conv2d(x3, w, None, 1, 1) - 1.0, rtol=1e-5, atol=1e-5)
    w.data = w.data.view(6, 4, 9, 1)  # the same storage: address and version as before
    torch.testing.assert_close(call(), F.conv2d(x, w, None, 1, 1) - 1.0, rtol=1e-5, atol=1e-5)


def test_torch_and_onednn_share_one_openmp_runtime() -> None:
    assert dnnl_route.glue() is not None
    runtimes = dnnl_conv.openmp_runtimes()
    assert len(runtimes) == 1, runtimes  # torch's libgomp, which libdnnl bound to (one thread pool)
    maps = Path("/proc/self/maps").read_text()
    assert "libdnnl.so" in maps


def test_a_missing_library_falls_back_with_one_reason(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(dnnl_route, "GLUE_PREFIX", str(tmp_path))  # no oneDNN there
    args, ref, _ = _case("odd-c20", torch.float32, True, False, False)
    with caplog.at_level(logging.WARNING, logger="autofusion.codegen"):
        for _ in range(3):
            before = dict(library.ROUTE_CALLS)
            y = op(*args, "relu", "dnnl", True)
            assert _ran(before) == {"onednn": 1}
            torch.testing.assert_close(y, torch.relu(ref), rtol=1e-4, atol=1e-4)
    said = [r.getMessage() for r in caplog.records]
    reasons = [m for m in said if "dnnl convolution route unavailable" in m]
    assert len(reasons) == 1 and "libdnnl" in reasons[0]
    assert "libdnnl" in (dnnl_conv.unavailable_reason(str(tmp_path)) or "")


def test_headers_missing_or_a_failing_compiler_say_so(tmp_path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libdnnl.so.3").write_bytes(b"")
    assert "headers" in str(dnnl_conv.find_install(tmp_path))
    assert dnnl_conv.load_glue(tmp_path / "cache", cxx="/bin/false") is None
    assert "failed" in (dnnl_conv.unavailable_reason(cxx="/bin/false") or "")


def test_the_layout_pass_times_and_picks_the_route(monkeypatch) -> None:
    """The route is one of the chain measurement's contenders: a timing under which it wins puts every
    chain on it."""
    from autofusion.passes.layout_timing import ChainTiming, measured_routes

    assert "dnnl" in library.ROUTES and "dnnl" in measured_routes()  # the real measurement times it
    fast = ChainTiming({"aten": 2e-3, "aten_cl": 2e-3, "onednn": 1.5e-3, "dnnl": 1e-3})
    monkeypatch.setattr(layout, "timer_for", lambda cache: lambda spec: fast)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, groups=8)
    ).eval()
    x = torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        before = dict(library.ROUTE_CALLS)
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)
    assert _ran(before) == {"dnnl": 2}


def test_a_zoo_cnn_runs_on_the_route() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo

    m, xs = zoo.build("mobilenet_v2", batch=1, tiny=True)
    with torch.no_grad():
        cm = autofusion.compile(m, list(xs), conv_layout="dnnl")
        ref = m(*xs)
        before = dict(library.ROUTE_CALLS)
        out = cm(*xs)
    ran = _ran(before)
    n_conv = sum(isinstance(mod, torch.nn.Conv2d) for mod in m.modules())
    assert ran == {"dnnl": n_conv}, ran
    out_t = out if isinstance(out, torch.Tensor) else out[0]
    ref_t = ref if isinstance(ref, torch.Tensor) else ref[0]
    torch.testing.assert_close(out_t, ref_t, rtol=1e-3, atol=1e-3)
