"""The CLI: argument handling, the demo table and exit codes, with the compiler replaced by stubs.

The stubs keep these tests independent of the compiler itself; end-to-end demo runs are tested elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from typing import Any

import pytest
import torch

import autofusion
import autofusion.api
from autofusion.tools.cli import main as cli
from autofusion.tools.diagnose.compare import relative_error


@pytest.fixture(autouse=True)
def _keep_the_log_level() -> Any:
    """main() sets the root logger's level (-v, --log-level); put it back for the next test."""
    import logging

    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


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
    monkeypatch.setattr(autofusion.api, "compile",
                        lambda m, x, **kw: _Compiled(m, offsets["api"],
                                                     eager=offsets["api_eager"]))  # fmt: skip
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

    monkeypatch.setattr(autofusion.api, "compile", broken)
    assert cli.main(["demo", "--model", "softmax", "--repeat", "1"]) == 1
    assert "[NF1001][no shared data]" in capsys.readouterr().out


def test_unknown_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--model", "transfomer"]) == 2
    err = capsys.readouterr().err
    assert "transformer-block" in err and "Traceback" not in err


def test_log_level_is_case_insensitive(stub_compilers: dict[str, float]) -> None:
    assert cli.main(["--log-level", "debug", "demo", "--model", "softmax", "--repeat", "1"]) == 0


def test_relative_error() -> None:
    ref = torch.tensor([1.0, -2.0, float("-inf")])
    assert relative_error(ref.clone(), ref) == 0.0
    assert relative_error(ref + torch.tensor([0.0, 0.02, 0.0]), ref) == pytest.approx(0.01)
    assert relative_error(torch.tensor([1.0, float("nan"), 0.0]), ref) == float("inf")
    assert relative_error(ref[:2], ref) == float("inf")
    assert relative_error(ref.half(), ref) == float("inf")
    assert relative_error((ref, {"a": ref}), (ref, {"a": ref})) == 0.0
    assert relative_error((ref,), (ref, ref)) == float("inf")


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
    # The export folds BN into the convs, so the conv rules without BN would take the whole block into
    # library calls; off, the ReLU and the residual add stay generated kernels, which the export shows.
    argv += ["--disable", "conv_relu,conv_add_relu"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    expected = ["IR ops imported", "fused kernels", "steps per run"]
    expected += ["memory traffic before", "memory traffic after"]
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
    got = capsys.readouterr()
    assert not got.out  # errors go to stderr, one line, no traceback
    assert "autofusion optimize: error:" in got.err and "not a valid ONNX file" in got.err
    assert "Traceback" not in got.err and len(got.err.strip().splitlines()) == 1
    assert cli.main(["optimize", str(cut), "--json"]) == 2
    assert "not a valid ONNX file" in json.loads(capsys.readouterr().out)["error"]
    for argv in (["optimize", "nomodel"], ["optimize", "builtin:nope"], ["optimize", "no_such_module_x:make"],
                 ["optimize", "builtin:softmax", "--dim", "bad"]):  # fmt: skip
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "error" in err and "Traceback" not in err


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


def test_optimize_rules_config_and_disable_change_the_plan(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
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
    assert "rules.yaml:3" in capsys.readouterr().err.replace("\n", " ")


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
    got = capsys.readouterr()
    assert "ran eagerly" in got.out and "refused by the test" in got.out
    assert "ran eagerly, not compiled" in got.err
    assert cli.main(["optimize", "builtin:softmax", "--repeat", "1", "--json"]) == 2
    assert "refused by the test" in json.loads(capsys.readouterr().out)["eager_fallback"]


# ---- conventions every subcommand follows ---------------------------------------------------------


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m autofusion ARGV` in a fresh process (the source tree this test imports first)."""
    import os
    from pathlib import Path

    src = str(Path(autofusion.__file__).parent.parent)
    path = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    full = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=full, timeout=600)


def test_help_and_version_load_no_torch() -> None:
    # A fresh interpreter: this one has torch loaded already.
    code = (
        "import sys\n"
        "from autofusion.tools.cli.main import main\n"
        "for argv in (['--help'], ['--version'], *[[c, '--help'] for c in "
        "('demo', 'optimize', 'explain', 'check', 'bisect', 'report', 'rules')]):\n"
        "    assert main(argv) == 0, argv\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'autofusion.api', "
        "'autofusion.compiler')))\n"
        "print('LOADED', bad)\n"
    )
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr
    assert "LOADED []" in r.stdout
    r = _run("-X", "importtime", "-m", "autofusion", "--help")
    assert r.returncode == 0 and "usage: autofusion" in r.stdout
    assert not [ln for ln in r.stderr.splitlines() if ln.rstrip().endswith(("| torch", "|   torch"))]


def test_python_m_autofusion_and_version() -> None:
    r = _run("-m", "autofusion", "--help")
    assert r.returncode == 0 and "usage: autofusion" in r.stdout and "exit status" in r.stdout
    r = _run("-m", "autofusion", "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"autofusion {autofusion.__version__}"


def test_usage_errors_exit_2_on_stderr_without_traceback(tmp_path, capsys) -> None:
    assert cli.main(["optimize", "builtin:softmax", "--repeat", "0"]) == 2  # argparse's own check
    assert "--repeat: must be >= 1" in capsys.readouterr().err
    assert cli.main(["no-such-command"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert cli.main(["explain", "builtin:softmax", "--target", "nope"]) == 2
    got = capsys.readouterr()
    assert "unknown hardware profile 'nope'" in got.err and "Traceback" not in got.err + got.out
    missing = tmp_path / "missing.txt"
    assert cli.main(["check", "builtin:softmax", "--disable-file", str(missing)]) == 2
    assert f"--disable-file {missing}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "var, value, says",
    [("AUTOFUSE_DFX_FLAGS", "--bogus=1", "AUTOFUSE_DFX_FLAGS: unknown key --bogus"),
     ("AUTOFUSION_RULES", "/no/such/rules.yaml", "/no/such/rules.yaml:0: cannot read rule file")],
)  # fmt: skip
def test_bad_environment_is_a_usage_error(
    var: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(var, value)
    for argv in (["optimize", "builtin:softmax", "--repeat", "1"], ["explain", "builtin:softmax"], ["rules"]):
        assert cli.main(argv) == 2, argv
        got = capsys.readouterr()
        assert says in got.err and "Traceback" not in got.err, argv
        assert len(got.err.strip().splitlines()) == 1


def test_internal_error_exits_3_with_the_traceback_only_when_verbose(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(autofusion.api, "compile", broken)
    assert cli.main(["explain", "builtin:softmax"]) == 3
    err = capsys.readouterr().err
    assert "internal error: KeyError" in err and "-v" in err and "Traceback" not in err
    assert cli.main(["explain", "builtin:softmax", "-v"]) == 3  # -v after the subcommand
    assert "Traceback" in capsys.readouterr().err
    assert cli.main(["--log-level", "debug", "explain", "builtin:softmax"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_log_level_after_the_subcommand(stub_compilers: dict[str, float]) -> None:
    import logging

    root = logging.getLogger()
    before = root.level
    try:
        assert cli.main(["demo", "--model", "softmax", "--repeat", "1", "--log-level", "info"]) == 0
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)
    args = cli.build_parser().parse_args(["--log-level", "error", "rules"])
    assert args.log_level == "ERROR"  # not reset by the subcommand's own default
    assert cli.build_parser().parse_args(["rules", "-v"]).log_level == "DEBUG"


def test_options_are_spelt_the_same_on_every_subcommand() -> None:
    parser = cli.build_parser()
    argv = ["--disable", "cse,tanh", "--disable", "exp", "--repeat", "3"]
    for cmd in ("optimize", "bisect", "report"):
        args = parser.parse_args([cmd, "builtin:softmax", *argv])
        assert args.disable == ["cse,tanh", "exp"] and args.repeat == 3, cmd
    assert parser.parse_args(["demo", *argv]).disable == ["cse,tanh", "exp"]
    for cmd in ("explain", "check"):
        assert parser.parse_args([cmd, "builtin:softmax", "--disable", "a,b"]).disable == ["a,b"]
    assert parser.parse_args(["report", "builtin:softmax", "--runs", "4"]).repeat == 4  # the old spelling


def test_disable_takes_a_comma_list_of_rules_passes_and_nodes() -> None:
    from autofusion.tools.cli.options import fusion_options

    argv = ["explain", "builtin:softmax", "--disable", "cse,tanh", "--disable", "exp"]
    args = cli.build_parser().parse_args(argv)
    got = fusion_options(args)
    assert "cse" in got["disabled"] and got["disable_fusion"] == ("tanh", "exp")


def test_kernels_per_run_is_one_pair_of_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    model, inputs = autofusion.builtin("transformer-block")
    with torch.no_grad():
        stats = autofusion.compile(model, inputs).stats
    line = f"{stats['fused_kernels']} fused kernels, {stats['kernels']} steps per run"
    assert stats["fused_kernels"] < stats["kernels"]
    assert cli.main(["explain", "builtin:transformer-block"]) == 0
    assert line in capsys.readouterr().out
    assert cli.main(["optimize", "builtin:transformer-block", "--json", "--repeat", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["fused_kernels"], out["kernels"]) == (stats["fused_kernels"], stats["kernels"])


def test_narrow_columns_never_cut_a_number(stub_compilers: dict[str, float]) -> None:
    import re

    from rich.table import Table

    from autofusion.tools.cli import common

    for width in (60, 100, 200):
        console = common.Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        table = Table(title="numbers")
        table.add_column("name")
        for col in ("a long column header", "another long one", "third", "fourth"):
            table.add_column(col, justify="right", no_wrap=True)
        numbers = ["123456.789", "98765.4321", "0.000012345", "31415926"]
        table.add_row("a rather long model name with words", *numbers)
        common.print_table(console, table)
        text = console.export_text()
        assert all(len(line) <= width for line in text.splitlines())
        for n in numbers:
            assert re.search(rf"(?<![\d.]){re.escape(n)}(?![\d.])", text), (width, n, text)
        assert "…" not in text


def test_columns_is_respected_by_the_commands(tmp_path) -> None:
    r = _run("-m", "autofusion", "explain", "builtin:elementwise-chain", env={"COLUMNS": "60"})
    assert r.returncode == 0, r.stderr
    assert all(len(line) <= 60 for line in r.stdout.splitlines())
    assert "…" not in r.stdout
    wide = _run("-m", "autofusion", "explain", "builtin:elementwise-chain", env={"COLUMNS": "250"})
    assert max(len(line) for line in wide.stdout.splitlines()) > 60
