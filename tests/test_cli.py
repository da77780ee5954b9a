"""The CLI: argument handling, the demo table and exit codes, with the compiler replaced by stubs.

The stubs keep these tests independent of the compiler itself; end-to-end demo runs are tested elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import types
from typing import Any

import pytest
import torch

import autofusion
from autofusion.tools.cli import main as cli


class _Compiled:
    """A compiled model stand-in; with `backend`, its first call hands the backend one graph, as
    Dynamo would."""

    def __init__(self, model: torch.nn.Module, offset: float, backend: Any = None, eager: str = "") -> None:
        self.model = model
        self.offset = offset
        self.backend = backend
        self.graph = types.SimpleNamespace(nodes=[object()] * 5)
        self.stats = {"ops": 5, "extern_calls": 2, **({"eager_fallback": eager} if eager else {})}

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.backend is not None:
            self.backend, backend = None, self.backend
            backend(None, list(inputs))
        return self.model(*inputs) + self.offset


@pytest.fixture
def stub_compilers(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace both compile paths; tests set ``offsets[kind]`` to make a path wrong, and
    ``offsets["api_eager"]`` / ``offsets["dynamo_eager"]`` to a reason to make it run eagerly."""
    offsets: dict[str, Any] = {"api": 0.0, "dynamo": 0.0, "api_eager": "", "dynamo_eager": ""}

    def backend(gm: Any, example_inputs: Any, **kw: Any) -> Any:
        def fn(*args: Any) -> Any:
            raise AssertionError("not called")

        reason = offsets["dynamo_eager"]
        fn.autofusion_graph = None if reason else object()  # type: ignore[attr-defined]
        stats = {"eager_fallback": reason} if reason else {}
        fn.autofusion_stats = lambda: stats  # type: ignore[attr-defined]
        return fn

    monkeypatch.setattr("autofusion.backend.autofusion_backend", backend)
    monkeypatch.setattr(autofusion, "compile",
                        lambda m, x, **kw: _Compiled(m, offsets["api"], eager=offsets["api_eager"]),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(torch, "compile",
                        lambda m, backend=None, **kw: _Compiled(m, offsets["dynamo"], backend))  # fmt: skip
    return offsets


def test_demo_all_equal(stub_compilers: dict[str, float], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--model", "layernorm", "softmax", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    for text in ("layernorm", "softmax", "eager ms", "autofusion ms", "speedup", "yes"):
        assert text in out


@pytest.mark.parametrize("kind", ["api", "dynamo"])
def test_demo_wrong_result_fails(
    kind: str, stub_compilers: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    stub_compilers[kind] = 1e-3
    assert cli.main(["demo", "--model", "layernorm", "--repeat", "1"]) == 1
    assert "relative error" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["api", "dynamo"])
def test_demo_eager_fallback_is_shown_and_fails(
    kind: str, stub_compilers: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    stub_compilers[f"{kind}_eager"] = "could not capture the model: no reason at all"
    assert cli.main(["demo", "--model", "layernorm", "--repeat", "1"]) == 1
    out = capsys.readouterr().out
    assert "compiled" in out and "eager (" in out and "no reason at all" in out
    assert "api" in out.split("eager (")[1] if kind == "api" else "torch.compile" in out.split("eager (")[1]


def test_demo_compile_error_is_reported(
    monkeypatch: pytest.MonkeyPatch, stub_compilers: dict[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(model: torch.nn.Module, inputs: Any, **kw: Any) -> Any:
        raise RuntimeError("cannot fuse, the reason is [NF1001][no shared data]")

    monkeypatch.setattr(autofusion, "compile", broken, raising=False)
    assert cli.main(["demo", "--model", "softmax", "--repeat", "1"]) == 1
    assert "[NF1001][no shared data]" in capsys.readouterr().out


def test_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--model", "transfomer"])
    assert info.value.code == 2
    assert "transformer-block" in capsys.readouterr().err


def test_log_level_is_case_insensitive(stub_compilers: dict[str, float]) -> None:
    assert cli.main(["--log-level", "debug", "demo", "--model", "softmax", "--repeat", "1"]) == 0


def test_relative_error() -> None:
    ref = torch.tensor([1.0, -2.0, float("-inf")])
    assert cli.relative_error(ref.clone(), ref) == 0.0
    assert cli.relative_error(ref + torch.tensor([0.0, 0.02, 0.0]), ref) == pytest.approx(0.01)
    assert cli.relative_error(torch.tensor([1.0, float("nan"), 0.0]), ref) == float("inf")
    assert cli.relative_error(ref[:2], ref) == float("inf")
    assert cli.relative_error(ref.half(), ref) == float("inf")
    assert cli.relative_error((ref, {"a": ref}), (ref, {"a": ref})) == 0.0
    assert cli.relative_error((ref,), (ref, ref)) == float("inf")


# ---- optimize (real compiler; small models) --------------------------------------------------------


def _onnx_file(tmp_path, name: str = "softmax"):
    import io
    import warnings

    model, inputs = autofusion.builtin(name)
    path = tmp_path / f"{name}.onnx"
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17)
    path.write_bytes(buf.getvalue())
    return path


def test_optimize_builtin_json_has_the_stats_keys(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert cli.main(["optimize", "builtin:elementwise-chain", "--json", "--check", "--repeat", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    model, inputs = autofusion.builtin("elementwise-chain")
    with torch.no_grad():
        stats = autofusion.compile(model, inputs).stats
    assert set(stats) <= set(out)
    assert out["fused_kernels"] == 1 and out["check_error"] <= 1e-5
    assert out["check_against"] == "eager PyTorch"
    assert out["measured_ms"] > 0


def test_optimize_onnx_file_check_bench_and_export(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    path = _onnx_file(tmp_path, "resnet-block")
    fused, plain = tmp_path / "fused.onnx", tmp_path / "plain.onnx"
    argv = ["optimize", str(path), "--check", "--bench", "--repeat", "2"]
    argv += ["--export", str(fused), "--export-plain", str(plain)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    expected = ["IR ops imported", "kernels per run", "memory traffic before", "memory traffic after"]
    expected += ["fallbacks"]
    expected += ["latency (est.)", "measured latency"]
    if importlib.util.find_spec("onnxruntime"):
        expected += ["onnxruntime (median)", "check vs onnxruntime"]
    else:
        expected += ["check vs reference runtime"]
    for text in expected:
        assert text in out, text
    model = onnx.load(str(fused))
    onnx.checker.check_model(model, full_check=True)
    assert model.functions and all(f.domain == "autofusion" for f in model.functions)
    onnx.checker.check_model(onnx.load(str(plain)), full_check=True)


def test_optimize_factory(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def make():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()\n"
        "    return model, (torch.randn(4, 8),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["optimize", "my_models:make", "--check", "--repeat", "1"]) == 0
    assert "check vs eager PyTorch" in capsys.readouterr().out


def test_optimize_bad_inputs(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _onnx_file(tmp_path)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[:40])
    assert cli.main(["optimize", str(cut)]) == 2
    out = capsys.readouterr().out
    assert "autofusion: error:" in out and "not a valid ONNX file" in out and "Traceback" not in out
    assert cli.main(["optimize", str(cut), "--json"]) == 2
    assert "not a valid ONNX file" in __import__("json").loads(capsys.readouterr().out)["error"]
    for argv in (["optimize", "nomodel"], ["optimize", "builtin:nope"], ["optimize", "no_such_module_x:make"],
                 ["optimize", "builtin:softmax", "--dim", "bad"]):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2


def test_optimize_check_failure_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autofusion.tools.cli import optimize as cli_optimize

    monkeypatch.setattr(cli_optimize, "relative_error", lambda out, ref: 0.5)
    assert cli.main(["optimize", "builtin:softmax", "--check", "--repeat", "1"]) == 1
    assert "0.5 rel. error" in capsys.readouterr().out


def test_optimize_checks_an_external_data_model_against_onnxruntime(tmp_path, capsys) -> None:
    import onnx

    src = _onnx_file(tmp_path, "mlp")
    model = onnx.load(str(src))
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="ext.bin", size_threshold=0)
    assert cli.main(["optimize", str(path), "--check", "--repeat", "1"]) == 0
    expected = "onnxruntime" if importlib.util.find_spec("onnxruntime") else "reference runtime"
    assert f"check vs {expected}" in capsys.readouterr().out


def test_optimize_rules_config_and_disable_change_the_plan(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    def stats(*extra: str) -> dict:
        assert cli.main(["optimize", "builtin:transformer-block", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    default = stats()
    assert not default.get("rules")  # the built-in rules ship off (classify_rule.yaml)
    config = tmp_path / "fusion_config.json"
    config.write_text(json.dumps({"fusion_config": {"attention_core_masked": "on"}}))
    on = stats("--config", str(config))
    assert on["rules"] == {"attention_core_masked": 1} and on["kernels"] != default["kernels"]
    off = stats("--config", str(config), "--disable", "attention_core_masked")
    assert not off.get("rules")
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "fusion_rules:\n  - name: my_linear_gelu\n    nodes:\n"
        "      - {op: Linear, inputs: [x, weight], output: linear_out}\n"
        "      - {op: Gelu, inputs: [linear_out], output: out}\n"
        "    priority: 99\n    becomes: library:linear_act\n"
    )
    mine = stats("--rules", str(rules))["rules"]
    assert mine.get("my_linear_gelu") == 1 and "linear_gelu" not in mine  # higher priority wins the window
    rules.write_text("fusion_rules:\n  - name: bad\n    pattern: [{op_type: Reluu}]\n")
    assert cli.main(["optimize", "builtin:transformer-block", "--rules", str(rules)]) == 2
    assert "rules.yaml:3" in capsys.readouterr().out.replace("\n", " ")


def test_optimize_report_for_onnx_and_torch_models(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _onnx_file(tmp_path, "layernorm")
    html = tmp_path / "onnx.html"
    assert cli.main(["optimize", str(path), "--report", str(html), "--repeat", "2"]) == 0
    text = html.read_text()
    baseline = "onnxruntime" if importlib.util.find_spec("onnxruntime") else "reference runtime"
    assert "<svg" in text and f"{baseline} " in text and "autofused_" in text
    html = tmp_path / "torch.html"
    assert cli.main(["optimize", "builtin:softmax", "--report", str(html), "--repeat", "2"]) == 0
    assert "eager PyTorch " in html.read_text() and str(html) in capsys.readouterr().out


def _refuse_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both routes fail to capture, as a model export cannot trace would."""
    import autofusion.api
    import autofusion.backend
    from autofusion.errors import FrontendError

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise FrontendError("could not capture the model: refused by the test")

    monkeypatch.setattr(autofusion.api, "capture", refuse)
    monkeypatch.setattr(autofusion.backend, "capture", refuse)


def test_demo_real_model_runs_compiled_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--model", "softmax", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "compiled" in out and "eager (" not in out


def test_demo_real_eager_fallback_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _refuse_capture(monkeypatch)
    assert cli.main(["demo", "--model", "softmax", "--repeat", "1"]) == 1
    out = capsys.readouterr().out
    assert "eager (api, torch.compile)" in out and "refused by the test" in out


def test_optimize_eager_fallback_is_shown_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["optimize", "builtin:softmax", "--repeat", "1"]) == 0
    assert "ran eagerly" in capsys.readouterr().out  # the row is always there: "no"
    _refuse_capture(monkeypatch)
    assert cli.main(["optimize", "builtin:softmax", "--repeat", "1"]) == 2
    out = capsys.readouterr().out
    assert "ran eagerly" in out and "refused by the test" in out
    assert cli.main(["optimize", "builtin:softmax", "--repeat", "1", "--json"]) == 2
    assert "refused by the test" in json.loads(capsys.readouterr().out)["eager_fallback"]
