"""Bisection over the solver's merges: a planted wrong (or slow) fused kernel is named, and the
disable list it writes repairs the model for the other tools."""

from __future__ import annotations

import json

import pytest

import autofusion
from autofusion import cli
from autofusion.dfx.bisect import bisect_fusion, first_bad


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
