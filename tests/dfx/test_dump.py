"""AUTOFUSE_DFX_FLAGS dumps: per graph and stage IR text, the plan, events, and a build that
compile.sh reproduces; the flag parser; adding a format is one registered function."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess

import onnx
import pytest
import torch
from google.protobuf import text_format

import autofusion
import autofusion.dfx.onnx_dump  # registers .onnx and .pbtxt before any test patches FORMATS
from autofusion.config import Options
from autofusion.config.env import parse_dfx_flags
from autofusion.dfx import dump

STAGES = [
    "AfterCapture",
    "AfterDce",
    "AfterGraphPasses",
    "AfterRulesAndDecompose",
    "AfterFusion",
    "FinalPlan",
]


def fn(x, y):
    return torch.softmax(x * y, -1) + 1.0


def _graph_dir(root):
    (graph_dir,) = (root / "autofuse_compile_debug").iterdir()
    return graph_dir


def test_flags_parse_like_cann() -> None:
    assert parse_dfx_flags("--codegen_compile_debug=true;--debug_dir=/tmp/x") == {
        "codegen_compile_debug": "true",
        "debug_dir": "/tmp/x",
    }
    assert parse_dfx_flags(" --codegen_compile_debug=TRUE ; ;--att_profiling=true") == {
        "codegen_compile_debug": "true"
    }
    with pytest.raises(ValueError, match="did you mean --debug_dir"):
        parse_dfx_flags("--debug_dri=/tmp")
    with pytest.raises(ValueError, match="expected one of true, false"):
        parse_dfx_flags("--codegen_compile_debug=yes")
    with pytest.raises(ValueError, match="not of the form --key=value"):
        parse_dfx_flags("codegen_compile_debug")
    env = {"AUTOFUSE_DFX_FLAGS": "--codegen_compile_debug=true;--debug_dir=/d"}
    assert Options.from_env(env).debug_dir == "/d"
    assert Options.from_env({"AUTOFUSE_DFX_FLAGS": "--debug_dir=/d"}).debug_dir == ""  # needs compile_debug
    assert (
        Options.from_env(
            {"TORCH_COMPILE_DEBUG": "1", "TORCH_COMPILE_DEBUG_DIR": "/r"}
        ).torch_compile_debug_dir
        == "/r/torch_compile_debug"
    )
    assert Options.from_env({"TORCH_COMPILE_DEBUG": "0"}).torch_compile_debug_dir == ""


def test_every_stage_and_the_build_are_dumped(tmp_path) -> None:
    inputs = (torch.randn(6, 33), torch.randn(6, 33))
    with torch.no_grad():
        cm = autofusion.compile(fn, inputs, debug_dir=str(tmp_path / "dump"))
        torch.testing.assert_close(cm(*inputs), fn(*inputs))
    d = _graph_dir(tmp_path / "dump")
    assert d.name.startswith("graph_") and d.name.endswith("_fn")
    names = sorted(p.name for p in d.iterdir())
    for i, stage in enumerate(STAGES):
        assert f"{i:02d}_{stage}.ir.txt" in names
    assert "softmax" in (d / "00_AfterCapture.ir.txt").read_text()
    assert (
        "softmax" not in (d / "03_AfterRulesAndDecompose.ir.txt").read_text()
    )  # decomposed into amax/exp/sum/div
    fused = (d / "04_AfterFusion.ir.txt").read_text()
    assert fused.count("kernel autofused_") == cm.stats["fused_kernels"] == 1
    assert "autofused_0" in (d / "05_FinalPlan.plan.txt").read_text()
    events = [json.loads(line) for line in (d / "events.jsonl").read_text().splitlines()]
    assert events == json.loads(json.dumps(cm.events, default=str))
    build = d / "build"
    assert {"graph.cpp", "compile.sh", "compiler_output.txt"} <= {p.name for p in build.iterdir()}
    assert 'extern "C" void autofused_0' in (build / "graph.cpp").read_text()
    if shutil.which("g++"):
        # compile.sh rebuilds the library from the dumped source, in the dump directory.
        r = subprocess.run(["bash", str(build / "compile.sh")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert (build / "graph.so").stat().st_size > 0


def test_a_format_is_one_function_and_a_failing_one_never_fails_the_compile(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[int, bool]] = []

    def count(graph, plan):
        seen.append((len(graph.nodes), plan is not None))
        return f"{len(graph.nodes)} nodes\n"

    def broken(graph, plan):
        raise RuntimeError("exporter not ready")

    monkeypatch.setattr(dump, "FORMATS", dict(dump.FORMATS))
    dump.register_format("count.txt", count)
    dump.register_format("onnx", broken)
    inputs = (torch.randn(6, 33), torch.randn(6, 33))
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        cm = autofusion.compile(fn, inputs, debug_dir=str(tmp_path))
        torch.testing.assert_close(cm(*inputs), fn(*inputs))
    d = _graph_dir(tmp_path)
    assert [p.name for p in sorted(d.glob("*.count.txt"))] == [
        f"{i:02d}_{s}.count.txt" for i, s in enumerate(STAGES)
    ]
    assert [p for _, p in seen] == [False, False, False, False, True, True]
    assert "as onnx failed: RuntimeError: exporter not ready" in caplog.text
    assert not list(d.glob("*.onnx"))


def test_graphs_are_numbered_per_compile(tmp_path) -> None:
    with torch.no_grad():
        for shape in ((2, 5), (3, 7)):
            autofusion.compile(fn, (torch.randn(shape), torch.randn(shape)), debug_dir=str(tmp_path))
    dirs = sorted(p.name for p in (tmp_path / "autofuse_compile_debug").iterdir())
    assert len(dirs) == 2 and dirs[0] < dirs[1]


def test_onnx_and_pbtxt_dumps_pass_the_checker_with_kernels_as_functions(tmp_path) -> None:
    inputs = (torch.randn(6, 33), torch.randn(6, 33))
    with torch.no_grad():
        cm = autofusion.compile(fn, inputs, debug_dir=str(tmp_path))
    d = _graph_dir(tmp_path)
    for i, stage in enumerate(STAGES):
        model = onnx.load(str(d / f"{i:02d}_{stage}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        parsed = text_format.Parse((d / f"{i:02d}_{stage}.pbtxt").read_text(), onnx.ModelProto())
        assert parsed == model
        if stage in ("AfterFusion", "FinalPlan"):
            assert len(model.functions) == cm.stats["fused_kernels"] == 1
            assert {f.domain for f in model.functions} == {"ai.autofusion.fused"}
            assert [n.op_type for n in model.functions[0].node if n.op_type != "full"] == [
                "mul",
                "amax",
                "sub",
                "exp",
                "sum",
                "div",
                "add",
            ]
        else:
            assert not model.functions
    before = onnx.load(str(d / "00_AfterCapture.onnx"))
    assert [n.op_type for n in before.graph.node if n.op_type != "full"] == ["mul", "softmax", "add"]
