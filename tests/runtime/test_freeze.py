"""Freezing: parameter-only work is computed once per parameter version, never read stale.

The model has the parameter-only subgraphs real models have: sibling Q/K/V projections (one linear on
concatenated weights after horizontal_pattern), a mask built from a buffer, a parameter-only
expression, odd sizes. Each kind of parameter change (a new Parameter assigned, load_state_dict
copying in place or assigning, an in-place update of a parameter or buffer, a new buffer tensor) must
show in the next result, through autofusion.compile and torch.compile(backend="autofusion"); the fold
must run once while nothing changes (`FoldedExecutor.fold_runs`), and linear steps on a parameter
weight must run the prepacked route a measurement chose.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import autofusion
from autofusion.backend import autofusion_backend
from autofusion.config import Options
from autofusion.runtime import prepack
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.library import FOLDS
from autofusion.tools.cli.main import build_parser
from autofusion.tools.cli.options import fusion_options

S, H = 7, 24  # odd sizes: no multiple of a vector width


class Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(H, H)
        self.k = torch.nn.Linear(H, H)
        self.v = torch.nn.Linear(H, H)
        self.register_buffer("mask", torch.tril(torch.ones(S, S)))
        self.scale = torch.nn.Parameter(torch.randn(H) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        a = (q @ k.transpose(-1, -2)) * H**-0.5
        a = a.masked_fill(self.mask == 0, float("-inf")).softmax(-1)
        return (a @ v) * (self.scale * 2 + 1).exp()


def _model(dtype: torch.dtype = torch.float32) -> Attn:
    torch.manual_seed(0)
    return Attn().eval().to(dtype)


def _compiled(m: torch.nn.Module, x: torch.Tensor, route: str, **options: Any) -> tuple[Any, list[Any]]:
    """The compiled callable and a list holding the CompiledGraph(s) it runs (for the fold counter)."""
    torch._dynamo.reset()
    if route == "autofusion.compile":
        cm = autofusion.compile(m, [x], **options)
        return cm, [cm.compiled]
    seen: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example: list[torch.Tensor]) -> Any:
        run = autofusion_backend(gm, example, options=options)
        seen.append(run.autofusion_graph)
        return run

    return torch.compile(m, backend=backend), seen


def _executor(graphs: list[Any]) -> FoldedExecutor:
    (graph,) = graphs
    assert graph is not None and graph.program is not None, "the graph ran eagerly"
    ex = graph.program.executor
    assert isinstance(ex, FoldedExecutor), type(ex)
    return ex


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}


ROUTES = ["autofusion.compile", "torch.compile"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fold_runs_once(route: str, dtype: torch.dtype) -> None:
    m = _model(dtype)
    x = torch.randn(2, S, H, dtype=dtype)
    with torch.no_grad():
        cm, graphs = _compiled(m, x, route)
        for _ in range(3):
            torch.testing.assert_close(cm(x), m(x), **_tol(dtype))
        ex = _executor(graphs)
        assert ex.fold_runs == 1
        entries = len(FOLDS.items)
        for _ in range(3):
            m.scale.mul_(1.0)  # a new version each time: folded again, the older values dropped
            cm(x)
        assert ex.fold_runs == 4 and len(FOLDS.items) == entries
        assert ex.split.folded_values >= 3  # QKV weight, QKV bias, mask, exp(scale * 2 + 1)
        stats = graphs[0].stats()["freeze"]
        assert stats["on"] and stats["folded_nodes"] >= 4


def _assign_param(m: Attn) -> None:
    m.q.weight = torch.nn.Parameter(torch.randn_like(m.q.weight))


def _assign_buffer(m: Attn) -> None:
    m.mask = torch.ones(S, S)


def _load_copy(m: Attn) -> None:
    m.load_state_dict({k: v * 1.5 if k != "mask" else v for k, v in m.state_dict().items()})


def _load_assign(m: Attn) -> None:
    sd = {
        k: torch.rand_like(v) + 0.5 if k != "mask" else torch.ones_like(v) for k, v in m.state_dict().items()
    }
    m.load_state_dict(sd, assign=True)


def _in_place_param(m: Attn) -> None:
    m.scale.add_(0.5)
    m.v.bias.mul_(-1)


def _in_place_buffer(m: Attn) -> None:
    m.mask.fill_(1.0)


CHANGES: dict[str, Callable[[Attn], None]] = {
    "assign a new Parameter": _assign_param,
    "assign a new buffer": _assign_buffer,
    "load_state_dict": _load_copy,
    "load_state_dict(assign=True)": _load_assign,
    "parameter changed in place": _in_place_param,
    "buffer changed in place": _in_place_buffer,
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_parameters_refold(change: str, route: str) -> None:
    m = _model()
    x = torch.randn(2, S, H)
    with torch.no_grad():
        cm, graphs = _compiled(m, x, route)
        before = cm(x)
        torch.testing.assert_close(before, m(x), rtol=1e-4, atol=1e-5)
        kept = before.clone()
        CHANGES[change](m)
        expected = m(x)
        assert not torch.allclose(expected, kept), "the change must change the result"
        torch.testing.assert_close(cm(x), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(cm(x), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(before, kept)  # an earlier result is the caller's, untouched
        if route == "autofusion.compile" or len(graphs) == 1:  # Dynamo may recompile on a new buffer
            ex = _executor(graphs[-1:])
            assert ex.fold_runs == 2  # once at first, once for the changed parameters, not per call


def test_freeze_switch() -> None:
    m = _model()
    x = torch.randn(2, S, H)
    with torch.no_grad():
        off = autofusion.compile(m, [x], freeze=False)
        torch.testing.assert_close(off(x), m(x), rtol=1e-4, atol=1e-5)
    assert off.compiled is not None and off.compiled.program is not None
    assert not isinstance(off.compiled.program.executor, FoldedExecutor)
    assert "freeze" not in off.stats
    assert Options.from_env({"AUTOFUSION_FREEZE": "0"}).freeze is False
    assert Options.from_env({}).freeze is True
    with pytest.raises(ValueError, match="AUTOFUSION_FREEZE"):
        Options.from_env({"AUTOFUSION_FREEZE": "maybe"})


@pytest.mark.parametrize("super_kernel", ["on", "off"])
def test_folded_with_both_executors(super_kernel: str) -> None:
    m = _model()
    x = torch.randn(1, S, H)
    with torch.no_grad():
        cm = autofusion.compile(m, [x], super_kernel=super_kernel)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
        _in_place_param(m)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert cm.stats["super_kernel"]["on"] is (super_kernel == "on")
    assert cm.compiled is not None and cm.compiled.generated_calls > 0


class ParamOut(torch.nn.Module):
    """Returns a parameter-only value and a view of one: the caller owns both results."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.w.exp()
        return x * e, (e * 2).reshape(24)


def test_outputs_owned_by_caller() -> None:
    torch.manual_seed(0)
    m = ParamOut().eval()
    x = torch.randn(4, 6)
    with torch.no_grad():
        cm = autofusion.compile(m, [x])
        _, b = cm(x)
        b.fill_(0.0)  # the caller may change what it got
        a2, b2 = cm(x)
        ea, eb = m(x)
    torch.testing.assert_close(a2, ea)
    torch.testing.assert_close(b2, eb)


def _force(route: str) -> Callable[[int, int, int, torch.dtype], dict[str, float] | None]:
    def fake(m: int, k: int, n: int, dtype: torch.dtype) -> dict[str, float]:
        return {"plain": 1.0, route: 0.5}

    return fake


@pytest.mark.parametrize("route", ["onednn", "mkl"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prepacked_route_runs(route: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch,
                              tmp_path: Any) -> None:  # fmt: skip
    if not prepack.available(route, dtype):
        pytest.skip(f"{route} has no {dtype} route in this torch build")
    monkeypatch.setattr(prepack, "measure", _force(route))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(H, 40), torch.nn.ReLU(), torch.nn.Linear(40, 9)).eval().to(dtype)
    x = torch.randn(3, S, H, dtype=dtype)
    with torch.no_grad():
        cm = autofusion.compile(m, [x], super_kernel="off", cache_dir=str(tmp_path))
        misses = FOLDS.misses
        torch.testing.assert_close(cm(x), m(x), **_tol(dtype))
        assert set(cm.stats["prepacked"].values()) == {route}, cm.stats["prepacked"]
        packed = [k for k in FOLDS.items if k[0] == "prepack" and k[1] == route]
        assert packed, "no weight was packed"
        cm(x)
        assert FOLDS.misses == misses + len(cm.stats["prepacked"])  # packed once, not per call
        entries = len(FOLDS.items)
        for _ in range(3):
            m[0].weight.mul_(1.0)  # each in-place change: packed again, the older copy dropped
            cm(x)
        assert len(FOLDS.items) == entries
        m[0].weight.mul_(-1.0)  # in place: packed again
        m[2].weight = torch.nn.Parameter(torch.randn_like(m[2].weight))  # replaced: packed again
        torch.testing.assert_close(cm(x), m(x), **_tol(dtype))
    # The choice was stored per machine: a second compile reads it instead of measuring.
    monkeypatch.setattr(prepack, "measure", lambda *a: pytest.fail("measured again"))
    with torch.no_grad():
        again = autofusion.compile(m, [x], super_kernel="off", cache_dir=str(tmp_path))
        torch.testing.assert_close(again(x), m(x), **_tol(dtype))
    assert set(again.stats["prepacked"].values()) == {route}


class MLPBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(H, 40)
        self.down = torch.nn.Linear(40, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x))) + x


def test_prepacked_linears_leave_super_kernel_entries(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A linear measured faster on a packed weight runs outside the SuperKernel entries (whose GEMM
    reads the weight as the module holds it); the rest of the plan stays inside them."""
    if not prepack.available("onednn", torch.float32):
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setattr(prepack, "measure", _force("onednn"))
    torch.manual_seed(0)
    m = MLPBlock().eval()
    x = torch.randn(2, S, H)
    with torch.no_grad():
        # GEMM epilogue fusion off: it would take both linears into generated kernels (their GEMMs no
        # longer op steps), and this test is about the linears that stay library calls.
        cm = autofusion.compile(m, [x], super_kernel="on", builtin_rules=False, cache_dir=str(tmp_path),
                                disabled=["gemm_epilogue"])  # fmt: skip
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
        m.up.weight.mul_(0.5)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert len(cm.stats["prepacked"]) == 2, cm.stats["prepacked"]
    assert cm.stats["super_kernel"]["on"] and cm.stats["super_kernel"]["library_calls_inside"] == 0
    assert cm.stats["generated_calls"] > 0


def test_prepacked_addmm_weight() -> None:
    """GPT-2's Conv1D: addmm(bias, x, W) with W stored [k, n] runs the packed route on W.T."""
    if not prepack.available("onednn", torch.float32):
        pytest.skip("no oneDNN in this torch build")
    torch.manual_seed(0)
    w, b = torch.randn(H, 40), torch.randn(40)
    x = torch.randn(S, H)
    y = prepack.linear(x, w, b, "onednn", transposed=True)
    torch.testing.assert_close(y, torch.addmm(b, x, w), rtol=1e-4, atol=1e-4)
    w.mul_(2.0)
    torch.testing.assert_close(prepack.linear(x, w, b, "onednn", transposed=True), torch.addmm(b, x, w),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_pick_needs_a_clear_win() -> None:
    assert prepack.pick({"plain": 1.0, "onednn": 0.97, "mkl": 1.2}) == "plain"
    assert prepack.pick({"plain": 1.0, "onednn": 0.97, "mkl": 0.94}) == "mkl"
    assert prepack.pick({"plain": 1.0, "onednn": 0.5, "mkl": 0.8}) == "onednn"
    assert prepack.pick({"plain": 1.0}) == "plain"


def test_pick_takes_mkl_packed_on_a_small_win() -> None:
    # MKL's packed GEMM runs plain's kernels without the per-call weight packing: a 4 % win takes it
    # (qwen2's down projection measured 0.958), while oneDNN, another library, still needs MARGIN.
    assert prepack.pick({"plain": 1.0, "onednn": 1.1, "mkl": 0.958}) == "mkl"
    assert prepack.pick({"plain": 1.0, "onednn": 0.958, "mkl": 1.1}) == "plain"
    assert prepack.pick({"plain": 1.0, "onednn": 1.1, "mkl": 0.995}) == "plain"  # noise, not a win


def test_busy_machine_times_routes_on_one_thread_in_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Busy: every route timed by one thread's CPU time on one thread (the thread count restored after);
    quiet: by the wall clock on the process's threads."""
    seen: list[tuple[object, int]] = []
    real = prepack._measure

    def spy(m, k, n, dtype, clock):
        seen.append((clock, torch.get_num_threads()))
        return real(m, k, n, dtype, clock)

    monkeypatch.setattr(prepack, "_measure", spy)
    threads = torch.get_num_threads()
    monkeypatch.setattr(prepack, "machine_busy", lambda: (True, "other processes use 3.0 cores"))
    best = prepack.measure(64, 96, 80, torch.float32)
    assert seen == [(time.thread_time, 1)] and torch.get_num_threads() == threads
    assert best is not None and set(best) >= {"plain"} and all(0 < t < 1 for t in best.values())
    monkeypatch.setattr(prepack, "machine_busy", lambda: (False, "other processes use 0.0 cores"))
    prepack.measure(64, 96, 80, torch.float32)
    assert seen[1] == (time.perf_counter, threads)


class Noisy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(self.w) * self.w.exp()


def test_random_ops_are_not_folded() -> None:
    """`rand_like(w)` reads only a parameter but is random: computed on every call; `exp(w)` is folded."""
    torch.manual_seed(0)
    m = Noisy().eval()
    x = torch.randn(4, 6)
    with torch.no_grad():
        cm = autofusion.compile(m, [x])
        a, b = cm(x), cm(x)
    assert not torch.equal(a, b)
    assert cm.stats["freeze"]["folded_nodes"] == 1  # the exp
    noise = (a - x) / m.w.detach().exp()
    assert bool(((noise >= 0) & (noise < 1)).all())


def test_cli_switch() -> None:
    args = build_parser().parse_args(["optimize", "builtin:mlp", "--no-freeze"])
    assert fusion_options(args)["freeze"] is False
    assert "freeze" not in fusion_options(build_parser().parse_args(["optimize", "builtin:mlp"]))


class _LinearGelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x)) * 0.5 + 1.0  # a kernel, not ATen's lone GELU


@pytest.mark.parametrize("route", ["plain", "onednn"])
def test_a_packed_win_keeps_the_gemm_out_of_its_epilogue_kernel(
    route: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """GEMM epilogue fusion calls the plain sgemm per block: where the prepacked weight measured faster,
    the linear stays a library call on the packed weight (a logged no with that reason); where it did
    not, the GEMM runs inside the GELU's kernel."""
    if route != "plain" and not prepack.available(route, torch.float32):
        pytest.skip(f"no {route} in this torch build")
    times = {"plain": 1.0} if route == "plain" else {"plain": 1.0, route: 0.5}
    monkeypatch.setattr(prepack, "measure", lambda m, k, n, dtype: times)
    torch.manual_seed(0)
    m = _LinearGelu().eval()
    x = torch.randn(128, 64)
    with torch.no_grad():
        cm = autofusion.compile(m, [x], builtin_rules=False, cache_dir=str(tmp_path))
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    (d,) = [d for d in cm.decisions if d["kind"] == "gemm_epilogue"]
    if route == "plain":
        assert d["accepted"] and not cm.stats["prepacked"]
    else:
        assert not d["accepted"] and "prepacked (onednn) measured faster" in d["reason"]
        assert list(cm.stats["prepacked"].values()) == ["onednn"]
    assert cm.stats["generated_calls"] > 0


def test_onnx_matmul_on_an_initializer_runs_prepacked(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """ONNX MatMul of a 3-D activation by a weight initializer (a `const` node, not a parameter input)
    takes the packed route too: the constant is the same tensor every call, packed once."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if not prepack.available("onednn", torch.float32):
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setattr(prepack, "measure", _force("onednn"))
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 80, generator=gen), torch.randn(80, generator=gen)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 37, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 37, 80])],
        [numpy_helper.from_array(w.numpy(), "w"), numpy_helper.from_array(b.numpy(), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    cm = autofusion.compile(model.SerializeToString(), cache_dir=str(tmp_path))
    x = torch.randn(2, 37, 48, generator=gen)
    misses = FOLDS.misses
    for _ in range(3):
        torch.testing.assert_close(cm(x), x @ w + b, rtol=1e-4, atol=1e-4)
    assert list(cm.stats["prepacked"].values()) == ["onednn"]
    assert FOLDS.misses == misses + 1  # packed once, not per call
    assert cm.stats["generated_calls"] > 0  # the bias add ran as a generated kernel
