"""Bisection over the solver's merges: a planted wrong (or slow) fused kernel is named, and the
disable list it writes repairs the model for the other tools."""

from __future__ import annotations

import json

import pytest

import autofusion
from autofusion.tools.cli import main as cli
from autofusion.tools.diagnose.bisect import bisect_fusion, first_bad


@pytest.fixture(autouse=True)
def linear_residual_on(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The planted rule, linear_residual, ships off (classify_rule.yaml); switch it on the way a user
    would, through a fusion_config file in the environment, so the CLI runs here see it too."""
    config = tmp_path_factory.mktemp("cfg") / "fusion_config.json"
    config.write_text('{"fusion_config": {"linear_residual": "on"}}')
    monkeypatch.setenv("AUTOFUSION_FUSION_CONFIG", str(config))


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 33])
def test_first_bad_finds_the_boundary_in_log_steps(n: int) -> None:
    for k in range(1, n + 1):
        probes: list[int] = []

        def is_bad(m: int, k: int = k, probes: list[int] = probes) -> bool:
            probes.append(m)
            return m >= k

        assert first_bad(n, is_bad) == k
        assert len(probes) <= max(1, (n - 1).bit_length())


def test_bisect_names_the_planted_wrong_merge(plant_wrong_fused_tanh: None, tmp_path) -> None:
    from dfx_test_models import chain

    model, inputs = chain()
    messages: list[str] = []
    r = bisect_fusion(
        model,
        inputs,
        mode="rtol",
        threshold=1e-5,
        options={"cache_dir": str(tmp_path)},
        progress=messages.append,
    )
    assert r.culprit is not None and r.index is not None
    assert "tanh" in r.culprit["first_nodes"] + r.culprit["second_nodes"]
    # The culprit is the first accepted merge (solver order) that puts tanh with another op.
    cm = autofusion.compile(model, inputs, cache_dir=str(tmp_path))
    merges = [e for e in cm.decisions if e["event"] == "fusion.candidate" and e["accepted"]]
    first_tanh = next(i for i, e in enumerate(merges) if "tanh" in e["first_nodes"] + e["second_nodes"])
    assert r.total_merges == len(merges) and r.index == first_tanh + 1 and r.culprit == merges[first_tanh]
    assert r.before is not None and r.before <= 1e-5 < r.after
    assert r.kernel is not None and "tanh" in r.kernel
    assert r.disable == ["tanh"] and r.disable_verified and r.disable_value <= 1e-5
    assert len(r.trials) <= 2 + 3 + 1  # ends, log2(5) probes, the one before
    assert messages and any("disable tanh" in m for m in messages)


def test_bisect_cli_writes_a_disable_list_the_other_tools_take(
    plant_wrong_fused_tanh: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    listing = tmp_path / "disable.txt"
    assert cli.main(["bisect", "dfx_test_models:chain", "--write-disable", str(listing)]) == 1
    out = capsys.readouterr().out
    assert "first bad merge" in out and "node2 tanh(tanh) fuse" in out
    assert [ln for ln in listing.read_text().splitlines() if not ln.startswith("#")] == ["tanh"]
    assert cli.main(["check", "dfx_test_models:chain", "--disable-file", str(listing)]) == 0
    capsys.readouterr()
    assert cli.main(["bisect", "dfx_test_models:chain", "--disable-file", str(listing), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["culprit"] is None


def test_bisect_clean_model_finds_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bisect", "dfx_test_models:chain"]) == 0
    assert "within tolerance: nothing to find" in capsys.readouterr().out


def test_bisect_slower_names_the_planted_slow_merge(plant_slow_fused_tanh: None, tmp_path) -> None:
    from dfx_test_models import chain

    model, inputs = chain()
    r = bisect_fusion(
        model,
        inputs,
        mode="slower",
        threshold=20.0,  # the planted spin is ~1000x the model; load on the machine is not
        repeat=5,
        repair=False,
        options={"cache_dir": str(tmp_path)},
    )
    assert r.culprit is not None
    assert "tanh" in r.culprit["first_nodes"] + r.culprit["second_nodes"]
    assert r.after > 10 * r.before  # the planted spin dwarfs the model


def test_bisect_all_finds_each_culprit_until_clean(
    plant_wrong_fused_tanh_and_sigmoid: None, capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    listing = tmp_path / "disable.txt"
    assert cli.main(["bisect", "dfx_test_models:chain", "--all", "--write-disable", str(listing)]) == 1
    out = capsys.readouterr().out
    assert out.count("first bad merge") == 2
    names = [ln for ln in listing.read_text().splitlines() if not ln.startswith("#")]
    assert sorted(names) == ["sigmoid", "tanh"]
    assert cli.main(["check", "dfx_test_models:chain", "--disable-file", str(listing)]) == 0


def test_bisect_names_the_planted_wrong_rule(plant_wrong_linear_residual: None, tmp_path) -> None:
    from dfx_test_models import residual

    model, inputs = residual()
    cm = autofusion.compile(model, inputs, cache_dir=str(tmp_path))
    assert cm.stats["rules"] == {"linear_residual": 1}  # the planted rule fires on this model
    messages: list[str] = []
    r = bisect_fusion(
        model, inputs, threshold=1e-5, options={"cache_dir": str(tmp_path)}, progress=messages.append
    )
    assert r.found and r.culprit is None and r.index is None
    assert (r.kind, r.switch) == ("rule", "linear_residual") and "linear_residual" in r.switches
    assert r.after > 1e-5 >= r.before  # on: over tolerance; off: within
    assert r.disable == ["linear_residual"] and r.disable_verified and r.disable_value <= 1e-5
    assert r.trials and r.trials[0].merges == 0 and r.trials[0].bad  # a rule is wrong with no merge too
    assert any("off linear_residual" in m for m in messages)


def test_bisect_cli_rule_culprit_writes_a_list_every_tool_takes(
    plant_wrong_linear_residual: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    listing = tmp_path / "disable.txt"
    assert cli.main(["bisect", "dfx_test_models:residual", "--write-disable", str(listing)]) == 1
    out = capsys.readouterr().out
    assert "first bad rule: linear_residual" in out and "checked" in out
    assert [ln for ln in listing.read_text().splitlines() if not ln.startswith("#")] == ["linear_residual"]
    # The same list turns the rule off in explain (it no longer fires) and repairs the model for bisect.
    assert cli.main(["explain", "dfx_test_models:residual", "--disable-file", str(listing), "--json"]) == 0
    capsys.readouterr()
    assert cli.main(["bisect", "dfx_test_models:residual", "--disable-file", str(listing), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert not got["found"] and got["switches"] == []


def test_disable_names_split_into_rules_passes_and_nodes(tmp_path) -> None:
    from autofusion.tools.cli.common import UsageError
    from autofusion.tools.cli.disable import disable_entries, read_disable_file, split_disable

    assert split_disable(["linear_residual", "cse", "tanh", "node:cse", "rule:linear_gelu"]) == (
        ["linear_residual", "cse", "linear_gelu"],
        ["tanh", "cse"],
    )
    with pytest.raises(UsageError, match="'rule:no_such_rule' names no rule or pass"):
        split_disable(["rule:no_such_rule"])
    # Written entries read back as the same split (a node named like a pass gets node:).
    listing = tmp_path / "d.txt"
    listing.write_text("\n".join(disable_entries(["cse"], ["tanh", "cse"])) + "\n")
    assert split_disable(read_disable_file(str(listing))) == (["cse"], ["tanh", "cse"])


def test_bisect_all_goes_on_from_a_rule_to_a_merge(
    plant_wrong_linear_residual: None, plant_wrong_fused_tanh: None, capsys, monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    # The planted tanh fault is in render.render_kernel; a GEMM + epilogue kernel renders its epilogue
    # through its own module, so the linear would carry the tanh kernel out of the fault's reach.
    monkeypatch.setenv("GF_AUTOFUSION_DISABLE", "gemm_epilogue")
    listing = tmp_path / "disable.txt"
    assert cli.main(["bisect", "dfx_test_models:residual", "--all", "--write-disable", str(listing)]) == 1
    out = capsys.readouterr().out
    # With the rule on, the model is bad even with no merge, so the merges are searched with it off
    # first; then, with tanh's merges refused, the rule is found.
    assert "first bad merge" in out and "found with linear_residual off" in out
    assert "first bad rule: linear_residual" in out
    names = [ln for ln in listing.read_text().splitlines() if not ln.startswith("#")]
    assert sorted(names) == ["linear_residual", "tanh"]
    assert cli.main(["bisect", "dfx_test_models:residual", "--disable-file", str(listing)]) == 0
    assert "within tolerance: nothing to find" in capsys.readouterr().out


def test_bisect_names_the_planted_wrong_pass(plant_wrong_pass: None, tmp_path) -> None:
    from dfx_test_models import residual

    model, inputs = residual()
    r = bisect_fusion(model, inputs, threshold=1e-5, options={"cache_dir": str(tmp_path)})
    assert (r.kind, r.switch) == ("pass", "algebraic_simplify")
    assert r.switches[0] == "linear_residual" and "algebraic_simplify" in r.switches  # rules, then passes
    assert r.disable == ["algebraic_simplify"] and r.disable_verified and r.after > 1e-5 >= r.before


def test_optimize_takes_the_disable_list_bisect_writes(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    listing = tmp_path / "off.txt"
    listing.write_text("# written by hand\nlinear_residual\ntanh\n")
    assert cli.main(["optimize", "dfx_test_models:residual", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert cli.main(["optimize", "dfx_test_models:residual", "--json", "--disable-file", str(listing)]) == 0
    off = json.loads(capsys.readouterr().out)
    assert full["rules"] == {"linear_residual": 1} and off["rules"] == {}  # the rule is off
    assert off["fused_kernels"] > full["fused_kernels"]  # and tanh's merges are refused
