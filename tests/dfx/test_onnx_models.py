"""The DFX tools take an .onnx path as MODEL (one loader for every tool): inputs come from the graph's
declared shapes (random, seeded), symbolic dims from `--dim NAME=SIZE`."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from autofusion.tools.cli import main as cli
from autofusion.tools.models.loader import load_model


def _write(tmp_path: Path, batch: int | str = 4) -> Path:
    """Y = Tanh(Exp(X) * W) + X over [batch, 33]: three pointwise ops and an add, one fused kernel."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [33], [0.01 * (i - 16) for i in range(33)])
    nodes = [
        helper.make_node("Exp", ["X"], ["e"], name="exp0"),
        helper.make_node("Mul", ["e", "W"], ["m"], name="mul0"),
        helper.make_node("Tanh", ["m"], ["s"], name="tanh0"),
        helper.make_node("Add", ["s", "X"], ["Y"], name="add0"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 33])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, 33])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    return path


def test_loader_reads_onnx_inputs_from_the_graph(tmp_path: Path) -> None:
    path = _write(tmp_path, batch="batch")
    with pytest.raises(ValueError, match=r"input 'X' dim 0 is dynamic \('batch'\); give its size with --dim"):
        load_model(str(path))
    model, inputs = load_model(str(path), {"batch": 3})
    assert model == path and len(inputs) == 1
    assert inputs[0].shape == (3, 33) and inputs[0].dtype == torch.float32
    with pytest.raises(ValueError, match="no such file"):
        load_model(str(tmp_path / "missing.onnx"))


def test_explain_an_onnx_model(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path)
    assert cli.main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 candidates, 3 merged, 0 rejected; 1 fused" in " ".join(out.split())
    assert cli.main(["explain", str(path), "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    merged = [e for e in events if e["event"] == "fusion.candidate" and e["accepted"]]
    assert len(merged) == 3
    assert {n for e in merged for n in e["first_nodes"] + e["second_nodes"]} >= {"exp0", "tanh0", "add0"}
    # Node names from the ONNX graph work in a disable list: tanh0's merges are refused (NF2100).
    assert cli.main(["explain", str(path), "--disable", "tanh0", "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    cands = [e for e in events if e["event"] == "fusion.candidate"]
    assert any(e["code"] == "NF2100" for e in cands)
    assert not any(e["accepted"] and "tanh0" in e["first_nodes"] + e["second_nodes"] for e in cands)


def test_check_an_onnx_model_with_a_symbolic_dim(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path, batch="batch")
    assert cli.main(["check", str(path), "--dim", "batch=5", "--json"]) == 0
    checks = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(checks) == 1 and not checks[0]["flagged"] and checks[0]["cosine"] > 0.99999
    assert cli.main(["check", str(path)]) == 2
    assert "--dim batch=SIZE" in capsys.readouterr().err


def test_a_broken_onnx_file_is_a_usage_error(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[:20])
    assert cli.main(["explain", str(cut)]) == 2
    assert "cut.onnx" in capsys.readouterr().err


def test_bisect_an_onnx_model_names_the_planted_merge(
    plant_wrong_fused_tanh: None, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path)
    listing = tmp_path / "off.txt"
    assert cli.main(["bisect", str(path), "--json", "--write-disable", str(listing)]) == 1
    got = json.loads(capsys.readouterr().out)  # compared with onnxruntime on the file
    sides = got["culprit"]["first_nodes"] + got["culprit"]["second_nodes"]
    assert got["kind"] == "merge" and "tanh0" in sides
    assert got["disable"] == ["tanh0"] and got["disable_verified"]
    assert [ln for ln in listing.read_text().splitlines() if not ln.startswith("#")] == ["tanh0"]
    assert cli.main(["bisect", str(path), "--disable-file", str(listing)]) == 0


def test_report_an_onnx_model(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path)
    out, data = tmp_path / "r.html", tmp_path / "r.json"
    assert cli.main(["report", str(path), "--out", str(out), "--runs", "2", "--json", str(data)]) == 0
    got = json.loads(data.read_text())
    assert got["baseline"] == "onnxruntime" and got["eager_ms"] > 0 and len(got["kernels"]) == 1
    assert "onnxruntime" in out.read_text()
