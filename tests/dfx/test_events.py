"""Decision log: structured events for every candidate, short INFO summaries, the disable list and
merge limit, and `autofusion explain` (text and JSON lines)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import autofusion
from autofusion.tools.cli import main as cli


def chain(x, y):
    return torch.tanh(torch.sigmoid(x * 1.5 + y) * x - 0.25)


def with_cycle(x):
    a = x.exp()
    b = torch.cumsum(a, 0)  # an extern between a and its other consumer: merging would make a cycle
    return a + b


def _run(fn, inputs, **options):
    with torch.no_grad():
        cm = autofusion.compile(fn, inputs, **options)
        torch.testing.assert_close(cm(*inputs), fn(*inputs), rtol=1e-5, atol=1e-6)
    return cm


def test_every_candidate_is_an_event_with_numbers() -> None:
    cm = _run(chain, (torch.randn(64, 100), torch.randn(64, 100)))
    cands = [e for e in cm.decisions if e["event"] == "fusion.candidate"]
    assert len(cands) == 5 and all(e["accepted"] for e in cands)
    for e in cands:
        assert e["rule"] == "cost model" and e["code"] == ""
        assert e["bytes_shared"] == 64 * 100 * 4
        assert e["bytes_saved"] > 0 and e["us_saved"] > 0
        assert set(e["terms_us"]) == {"mem_saved", "sched_saved", "ilp_gain", "reg_spill", "tile_overhead"}
        assert 0 < e["budget_used"] <= 1 and e["live_bytes"] <= e["budget_bytes"]
        assert e["first_nodes"] and e["second_nodes"]
        json.dumps(e)  # every event is plain JSON
    kernels = [e for e in cm.events if e["event"] == "codegen.kernel"]
    assert len(kernels) == 1 and kernels[0]["ops"].count("tanh") == 1 and kernels[0]["estimated_us"] > 0
    assert [e["pass"] for e in cm.events if e["event"] == "rewrite.pass"] == [
        "AfterDce",
        "AfterGraphPasses",
        "AfterRulesAndDecompose",
    ]
    assert any(e["event"] == "codegen.build" for e in cm.events)


def test_rejection_carries_code_rule_and_the_grep_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="autofusion.fusion"):
        cm = _run(with_cycle, (torch.randn(5, 6),))
    rejected = [e for e in cm.decisions if not e["accepted"]]
    assert [e["code"] for e in rejected] == ["NF1002"]
    assert rejected[0]["rule"] == "cycle check"
    line = rejected[0]["line"]
    assert line.startswith("node1 exp(exp) and node2 add(add) cannot fuse, the reason is [NF1002][")
    assert line in caplog.text


def test_info_is_one_summary_per_channel_and_warning_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    inputs = (torch.randn(5, 6),)
    with caplog.at_level(logging.INFO, logger="autofusion"):
        _run(with_cycle, inputs)
    by_channel = {}
    for r in caplog.records:
        by_channel.setdefault(r.name, []).append(r.getMessage())
    for name in ("autofusion.fusion", "autofusion.rewrite", "autofusion.codegen", "autofusion.runtime"):
        assert len(by_channel.get(name, [])) == 1, (name, by_channel)
    (summary,) = by_channel["autofusion.fusion"]
    assert summary.startswith(
        "fusion with_cycle: 1 candidates, 0 merged, 1 rejected (NF1002 x1); 2 fused kernels"
    )
    assert "cannot fuse" not in caplog.text  # per-pair lines are DEBUG
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autofusion"):
        _run(with_cycle, inputs)
    assert caplog.records == []


def test_disable_list_refuses_merges_with_nf2100(caplog: pytest.LogCaptureFixture) -> None:
    inputs = (torch.randn(64, 100), torch.randn(64, 100))
    with caplog.at_level(logging.DEBUG, logger="autofusion.fusion"):
        cm = _run(chain, inputs, disable_fusion=["tanh"])
    blocked = [e for e in cm.decisions if e["code"] == "NF2100"]
    assert blocked and all("tanh" in e["first_nodes"] + e["second_nodes"] for e in blocked)
    assert "[NF2100][tanh on the disable list" in caplog.text
    assert cm.stats["fused_kernels"] == 2  # tanh alone, the rest fused


def test_merge_limit_keeps_the_solver_prefix() -> None:
    inputs = (torch.randn(64, 100), torch.randn(64, 100))
    full = [e for e in _run(chain, inputs).decisions if e["accepted"]]
    for k in (0, 2, 5):
        cm = _run(chain, inputs, max_merges=k)
        accepted = [e for e in cm.decisions if e["accepted"]]
        assert [(e["first"], e["second"]) for e in accepted] == [(e["first"], e["second"]) for e in full[:k]]
        assert cm.stats["fused_kernels"] == 6 - k
        assert all(e["code"] == "NF2101" for e in cm.decisions if not e["accepted"])


def test_explain_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "builtin:elementwise-chain"]) == 0
    out = capsys.readouterr().out
    for text in ("5 candidates, 5 merged", "fusion decisions", "cost model", "autofused_0_mul_add_sigmoid"):
        assert text in out
    assert cli.main(["explain", "dfx_test_models:cycle", "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = {e["event"] for e in events}
    assert {"fusion.candidate", "codegen.kernel", "runtime.plan", "rewrite.pass", "codegen.build"} <= kinds
    assert [e["code"] for e in events if e["event"] == "fusion.candidate"] == ["NF1002"]


def test_explain_bad_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "no_such_module_xyz:make"]) == 2
    assert "cannot import module 'no_such_module_xyz'" in capsys.readouterr().err
    assert cli.main(["explain", "chain"]) == 2
    err = capsys.readouterr().err
    assert "expected builtin:NAME, a path to an .onnx file, or package.module:factory" in err


def test_explain_filters(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "builtin:transformer-block", "--json", "--rejected", "--code", "NF1002"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    cands = [e for e in events if e["event"] == "fusion.candidate"]
    assert cands and all(not e["accepted"] and e["code"] == "NF1002" for e in cands)
    assert any(e["event"] == "codegen.kernel" for e in events)
    assert cli.main(["explain", "builtin:elementwise-chain", "--json", "--node", "tanh"]) == 0
    cands = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    cands = [e for e in cands if e["event"] == "fusion.candidate"]
    # tanh joining sub_1, then that group joining the rest
    assert len(cands) == 2 and all("tanh" in e["first_nodes"] + e["second_nodes"] for e in cands)
