"""A package stores what the first call computes from the weights alone (package/warm.py): the frozen
parameter-only subgraph's values and oneDNN-packed linear weights. Loaded, the first call computes
neither (fold_runs and the fold cache's misses prove it) and gives eager's result; a weight changed
after loading is folded and packed again; a model's own weights (`weights="reference"`) and another
CPU never get the stored values. Also: the loader's unpickling pauses the cyclic collector and
restores it, also on error."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autofusion
from autofusion.package import pickling, warm
from autofusion.runtime import packed_blob, prepack
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.library import FOLDS, POST_OP_CALLS, post_op_available

pytestmark = pytest.mark.skipif(os.system("g++ --version > /dev/null 2>&1") != 0, reason="needs g++")
ONEDNN = prepack.available("onednn", torch.float32)


class Attention(torch.nn.Module):
    """Q/K/V projections of one input (frozen into one concatenated weight) and an output projection."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) / 8.0, -1)
        return self.o(torch.relu(a @ self.v(x)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, torch.Tensor, str, str]:
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(2, 13, 64)  # 26 rows: not a multiple of any block
    with torch.no_grad():
        cm = autofusion.compile(model, (x,), linear_route="onednn" if ONEDNN else "auto")
        cm(torch.randn(1, 5, 64))  # a second signature: weights packed for another row count
        cm(x)
    ex = cm.last.program.executor
    assert isinstance(ex, FoldedExecutor) and ex.split.folded_values > 0
    d = tmp_path_factory.mktemp("warm")
    copy, ref = str(d / "copy.afpkg"), str(d / "ref.afpkg")
    autofusion.save(cm, copy, weights="copy")
    autofusion.save(cm, ref, weights="reference")
    return model, x, copy, ref


def test_first_call_computes_no_weight_work(saved: tuple) -> None:
    model, x, copy, _ = saved
    cm = autofusion.load(copy)
    for inp in (x, torch.randn(1, 5, 64)):  # both saved signatures
        misses = FOLDS.misses
        with torch.no_grad():
            got = cm(inp)
            want = model(inp)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        ex = cm.last.program.executor
        assert ex.fold_runs == 0  # the stored folded values were taken
        assert ex.generated_calls > 0  # the saved kernels ran
        if ONEDNN:
            assert ex.prepacked and set(ex.prepacked.values()) == {"onednn"}
            assert FOLDS.misses == misses  # every packed weight was rebuilt from the package, none packed


def test_weight_changed_after_load_recomputes(saved: tuple) -> None:
    model, x, copy, _ = saved
    cm = autofusion.load(copy)
    ex = cm.last.program.executor
    sources = warm.bound_inputs(cm.last.captured.sources)
    names = {kind_ref[1].target: t for kind_ref, t in zip(cm.last.captured.sources, sources, strict=True)
             if kind_ref[0] == "live"}  # fmt: skip
    with torch.no_grad():
        cm(x)
        changed = Attention().eval()
        changed.load_state_dict(model.state_dict())
        for target in ("q.weight", "o.weight"):  # a folded one and one packed straight from the weight
            names[target].mul_(-0.5)  # in place: the version moves, the tensor stays the same
            changed.get_parameter(target).mul_(-0.5)
        got = cm(x)
        want = changed(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert ex.fold_runs == 1
    assert not torch.allclose(want, model(x).detach(), atol=1e-3)  # the change matters


def test_model_weights_by_reference_are_not_taken_from_the_package(saved: tuple) -> None:
    _, x, _, ref = saved
    other = Attention().eval()  # the same shapes, other weights: nothing stored may stand for them
    cm = autofusion.load(ref, model=other)
    ex = cm.last.program.executor
    with torch.no_grad():
        torch.testing.assert_close(cm(x), other(x), rtol=1e-5, atol=1e-5)
    assert ex.fold_runs == 1


def test_another_cpu_packs_again(saved: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, copy, _ = saved
    monkeypatch.setattr(warm, "features_digest", lambda: "another-cpu")
    cm = autofusion.load(copy)
    misses = FOLDS.misses
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    assert cm.last.program.executor.fold_runs == 0  # folded values do not depend on the CPU
    if ONEDNN:
        assert FOLDS.misses > misses  # packed here, not rebuilt


class GeluMlp(torch.nn.Module):
    """Linear + GELU (one oneDNN call with the GELU as its post-op, on a packed weight) and a linear."""

    def __init__(self, d: int = 48, hidden: int = 96) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


@pytest.mark.skipif(not post_op_available(torch.float32), reason="a torch without oneDNN's fused linear")
def test_post_op_linear_weights_are_stored(tmp_path) -> None:
    """The weight of a Linear + GELU post-op call is packed at save time too: loaded, the first call runs
    the fused call on the rebuilt weight (no packing) and gives eager's result; with the weights by
    reference it is packed again from the model's own."""
    torch.manual_seed(2)
    model = GeluMlp().eval()
    x = torch.randn(3, 11, 48)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,), linear_route="onednn")  # forced: the post-op call is taken
        cm(x)
    assert POST_OP_CALLS["gelu"] > 0
    path = str(tmp_path / "gelu.afpkg")
    autofusion.save(cm, path, weights="copy")
    loaded = autofusion.load(path)
    misses, calls = FOLDS.misses, POST_OP_CALLS["gelu"]
    with torch.no_grad():
        got = loaded(x)
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert POST_OP_CALLS["gelu"] > calls  # the fused call ran
    assert FOLDS.misses == misses  # on the stored packed weight: nothing was packed
    other = GeluMlp().eval()
    ref = str(tmp_path / "gelu-ref.afpkg")
    autofusion.save(cm, ref, weights="reference")
    by_ref = autofusion.load(ref, model=other)
    misses = FOLDS.misses
    with torch.no_grad():
        torch.testing.assert_close(by_ref(x), other(x), rtol=1e-5, atol=1e-5)
    assert FOLDS.misses > misses  # packed from the model's weights, not taken from the package


@pytest.mark.skipif(not prepack.available("onednn", torch.bfloat16), reason="oneDNN bf16 linear")
def test_packed_blob_round_trip_bf16_and_refusals() -> None:
    torch.manual_seed(1)
    w = torch.randn(96, 40).bfloat16()
    x = torch.randn(7, 40).bfloat16()
    p = torch.ops.mkldnn._reorder_linear_weight(w, 7)
    exported = packed_blob.export(p)
    assert exported is not None
    raw, md = exported
    q = packed_blob.rebuild(raw, list(p.shape), list(p.stride()), md, p.dtype)
    assert q is not None
    y = torch.ops.mkldnn._linear_pointwise(x, q, None, "none", [], "")
    want = torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    short = raw[: raw.numel() // 2].clone()  # fewer bytes than the descriptor says: refused
    assert packed_blob.rebuild(short, list(p.shape), list(p.stride()), md, p.dtype) is None
    assert packed_blob.export(w) is None  # a plain tensor is no packed weight


def test_unpickling_pauses_the_collector_and_restores_it() -> None:
    SEEN.clear()
    data, tensors, _, _, _ = pickling.dump({"probe": _Probe()})
    assert gc.isenabled()
    pickling.load(data, tensors, lambda name, is_buffer: None)
    assert SEEN == [False] and gc.isenabled()
    with pytest.raises(pickle.UnpicklingError):
        pickling.load(b"\x80\x05garbage", [], lambda name, is_buffer: None)
    assert gc.isenabled()
    gc.disable()
    try:
        pickling.load(data, tensors, lambda name, is_buffer: None)
        assert not gc.isenabled()  # a collector the caller paused stays paused
    finally:
        gc.enable()


SEEN: list[bool] = []


def _record_gc() -> None:
    SEEN.append(gc.isenabled())


class _Probe:
    """Unpickles by calling `_record_gc`, which notes whether the collector ran then."""

    def __reduce__(self) -> tuple:
        return (_record_gc, ())


@pytest.mark.parametrize("enabled", [True, False])
def test_importing_the_load_path_pauses_the_collector_and_restores_it(enabled: bool) -> None:
    """`autofusion.package` imports the load path's modules with the collector paused (no collection
    starts while some of them are imported and others not yet) and leaves it as it found it."""
    code = (
        "import gc, sys, torch, autofusion\n"
        f"enabled = {enabled}\n"
        "gc.enable() if enabled else gc.disable()\n"
        "count = lambda: sum(m.startswith('autofusion.') for m in sys.modules)\n"
        "before, seen = count(), []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and seen.append(count()))\n"
        "import autofusion.package\n"
        "after = count()\n"
        "assert 'autofusion.package.loading' in sys.modules and after > before + 20\n"
        "inside = [n for n in seen if before + 1 < n < after]\n"
        "assert not inside, f'collections ran inside the import, with {inside} of {after} modules'\n"
        "assert gc.isenabled() == enabled\n"
        "print('OK')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(autofusion.__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
