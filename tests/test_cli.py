"""The CLI: argument handling, the demo table and exit codes, with the compiler replaced by stubs.

The stubs keep these tests independent of the compiler itself; end-to-end demo runs are tested elsewhere.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import autofusion
from autofusion import cli


class _Compiled:
    def __init__(self, model: torch.nn.Module, offset: float) -> None:
        self.model = model
        self.offset = offset
        self.graph = types.SimpleNamespace(nodes=[object()] * 5)
        self.stats = {"ops": 5, "extern_calls": 2}

    def __call__(self, *inputs: torch.Tensor) -> Any:
        return self.model(*inputs) + self.offset


@pytest.fixture
def stub_compilers(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """Replace both compile paths; tests set ``offsets[kind]`` to make a path wrong."""
    offsets = {"api": 0.0, "dynamo": 0.0}
    monkeypatch.setattr(autofusion, "compile", lambda m, x, **kw: _Compiled(m, offsets["api"]), raising=False)
    monkeypatch.setattr(torch, "compile", lambda m, backend=None, **kw: _Compiled(m, offsets["dynamo"]))
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
