"""benchmarks/bench_models.py, the model benchmark, on one tiny zoo model: the harness builds, checks and
times its contenders, writes its JSON, and turns a wrong result into exit code 1 (a wrong contender is
reported, never timed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # bench_models imports its neighbours (zoo, bench_fusion) as scripts do
import bench_models  # noqa: E402
import zoo  # noqa: E402

ARGS = ["--tiny", "--models", "bert", "--batch", "1", "--rounds", "2", "--contenders", "eager", "af_torch"]


def test_zoo_rebuilds_the_same_model() -> None:
    """The OpenVINO contender rebuilds the model in another process: same name and seed, same weights."""
    (m1, x1), (m2, x2) = zoo.build("bert", 1, tiny=True), zoo.build("bert", 1, tiny=True)
    assert all(torch.equal(a, b) for a, b in zip(x1, x2, strict=True))
    with torch.no_grad():
        assert torch.equal(m1(*x1), m2(*x2))
    assert not torch.equal(zoo.build("bert", 1, tiny=True, seed=1)[1][0], x1[0])


def test_runs_checks_and_times(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert bench_models.main([*ARGS, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["contenders"] == ["eager", "af_torch"]
    (run,) = doc["runs"]
    assert run["model"] == "bert" and run["batch"] == 1 and not run["wrong"]
    assert set(run["ms"]) == {"eager", "af_torch"} and all(v > 0 for v in run["ms"].values())
    assert run["max_abs_err"]["af_torch"] <= bench_models.ATOL
    assert run["gflop"] > 0 and doc["gemm_peak_gflops"] > 0
    assert run["af_stats"]["kernels"] > 0 and not run["af_stats"]["eager_fallback"]
    assert run["af_stats"]["warm_cache_hit"] is True  # the second compile on the same cache is a hit
    assert run["compile_s"]["af_cold"] > 0


def test_a_wrong_result_fails_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = bench_models.af_torch_runner

    def off_by_a_little(*args: object) -> object:
        f = real(*args)  # type: ignore[arg-type]
        return lambda: f() + 1e-3

    monkeypatch.setattr(bench_models, "af_torch_runner", off_by_a_little)
    out = tmp_path / "out.json"
    assert bench_models.main([*ARGS, "--json", str(out)]) == 1
    (run,) = json.loads(out.read_text())["runs"]
    assert "af_torch" in run["wrong"] and "af_torch" not in run["ms"]  # reported, not timed


def test_check_tolerance() -> None:
    ref = [torch.ones(4, 4)]
    assert bench_models.check([torch.ones(4, 4) + 5e-5], ref)[0] == ""
    assert "16 of 16" in bench_models.check([torch.ones(4, 4) + 1e-3], ref)[0]
    assert "shape" in bench_models.check([torch.ones(4, 5)], ref)[0]
    assert "outputs" in bench_models.check([torch.ones(4, 4), torch.ones(1)], ref)[0]


def test_profile_step_labels() -> None:
    """--profile names each plan step by kind: generated kernels by their ops, externs by their ATen op."""
    import autofusion

    module, inputs = zoo.build("gpt2", 1, tiny=True)
    with torch.no_grad():
        cm = autofusion.compile(module, list(inputs))
    steps = cm.compiled.program.plan.steps
    labels = [bench_models.step_label(s) for s in steps]
    assert {kind for kind, _ in labels} <= {"kernel", "op", "view"}
    assert any(kind == "kernel" for kind, _ in labels)
    assert all(what != "extern" for _, what in labels)  # an extern shows the op it calls


def test_the_static_cache_decode_step_runs_for_the_contenders_that_take_it(tmp_path: Path) -> None:
    """llama_decode_static: transformers' StaticCache written in place; the exporter refuses the cache
    object (n/a with its reason), eager and autofusion run it, and the pinned length makes every call
    the same step (the check after the compiles would fail otherwise)."""
    out = tmp_path / "out.json"
    args = ["--tiny", "--models", "llama_decode_static", "--batch", "1", "--rounds", "2",
            "--contenders", "eager", "ort", "af_torch", "--json", str(out)]  # fmt: skip
    assert bench_models.main(args) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert not run["wrong"] and set(run["ms"]) == {"eager", "af_torch"}
    assert "StaticCache" in run["na"]["ort"]
    assert run["max_abs_err"]["af_torch"] <= bench_models.ATOL
    module, (ids, cache) = zoo.build("llama_decode_static", 1, tiny=True)
    with torch.no_grad():
        first, again = module(ids, cache), module(ids, cache)
    assert torch.equal(first, again)  # the same step each call
    assert [int(layer.cumulative_length) for layer in cache.layers] == [zoo.TINY_SEQ] * len(cache.layers)
