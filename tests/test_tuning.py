"""Tuning records and the tuner: records are found only for their graph and machine, applied as option
overrides that really change the plan, and shown in stats; the search drops wrong candidates, skips
knobs that change nothing, and takes only wins above the noise. Nothing here asserts a speed."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import autofusion
from autofusion import tuning
from autofusion.cache import Cache
from autofusion.config import Options
from autofusion.tools.cli.main import main
from autofusion.tools.tune import search


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * 2 + 1


def _model() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    return Block().eval(), [torch.randn(8, 32)]


def _record(graph: str, overrides: dict, machine: str | None = None) -> tuning.TuningRecord:
    return tuning.TuningRecord(
        graph=graph, machine=machine or tuning.machine_fingerprint(), overrides=overrides,
        default_ms=2.0, tuned_ms=1.0, decisions=(tuning.Decision("disabled", ["gemm_epilogue"], 2.0),),
    )  # fmt: skip


def test_a_record_in_the_cache_changes_the_plan_and_shows_in_stats(tmp_path) -> None:
    model, xs = _model()
    plain = autofusion.compile(model, xs, cache_dir=str(tmp_path), tuning="off")
    assert "tuning" not in plain.stats
    key = tuning.graph_hash(plain.graph)
    tuning.store(_record(key, {"disabled": ["gemm_epilogue"], "super_kernel": "off"}), Cache(tmp_path))
    tuned = autofusion.compile(model, xs, cache_dir=str(tmp_path))  # tuning="auto" is the default
    stats = tuned.stats
    assert stats["tuning"]["overrides"] == {"disabled": ["gemm_epilogue"], "super_kernel": "off"}
    assert stats["tuning"]["decisions"][0]["gain"] == 2.0
    # The overrides reached the compiler: another plan, and no SuperKernel.
    assert search.plan_key(tuned) != search.plan_key(plain)
    assert tuned.compiled.program.stats.get("super_kernel") in (None, False, 0) or not stats.get(
        "super_kernels"
    )
    with torch.no_grad():
        torch.testing.assert_close(tuned(*xs), model(*xs))
        assert tuned.stats["generated_calls"] >= 1
    off = autofusion.compile(model, xs, cache_dir=str(tmp_path), tuning="off")
    assert "tuning" not in off.stats and search.plan_key(off) == search.plan_key(plain)


def test_records_of_another_machine_or_graph_never_apply(tmp_path) -> None:
    model, xs = _model()
    key = tuning.graph_hash(autofusion.compile(model, xs, cache_dir=str(tmp_path), tuning="off").graph)
    cache = Cache(tmp_path)
    tuning.store(_record(key, {"super_kernel": "off"}, machine="other cpu|isa=0|autofusion=0"), cache)
    tuning.store(_record("0" * 64, {"super_kernel": "off"}), cache)
    assert "tuning" not in autofusion.compile(model, xs, cache_dir=str(tmp_path)).stats


def test_record_file_form_and_bad_records(tmp_path) -> None:
    model, xs = _model()
    key = tuning.graph_hash(autofusion.compile(model, xs, cache_dir=str(tmp_path), tuning="off").graph)
    path = tmp_path / "records.jsonl"
    tuning.store(_record(key, {"max_fusion_size": 8}), path)
    tuning.store(_record(key, {"max_fusion_size": 4}), path)  # same key: replaced, not appended
    assert len(path.read_text().splitlines()) == 1
    got = autofusion.compile(model, xs, cache_dir=str(tmp_path), tuning=str(path)).stats["tuning"]
    assert got["overrides"] == {"max_fusion_size": 4}
    with pytest.raises(ValueError, match="existing record file"):
        Options(tuning=str(tmp_path / "missing.jsonl"))
    # A record may not set options outside what the tuner searches (say, where files are written).
    bad = {**_record(key, {}).to_json(), "overrides": {"cache_dir": "/tmp/x"}}
    path.write_text(json.dumps(bad) + "\n")
    assert "tuning" not in autofusion.compile(model, xs, cache_dir=str(tmp_path), tuning=str(path)).stats


def test_set_overrides_add_to_the_callers_switches() -> None:
    options = Options(disabled=frozenset({"cse"}))
    applied = tuning.apply(_record("g", {"disabled": ["gemm_epilogue"], "freeze": False}), options)
    assert applied.disabled == {"cse", "gemm_epilogue"} and applied.freeze is False


def test_knobs_cover_rules_passes_and_limits() -> None:
    labels = [k.label for k in search.knobs(Options(), {})]
    assert "rule attention_core on" in labels and "rule conv_bn off" in labels
    assert "pass gemm_epilogue off" in labels and "super_kernel=off" in labels
    assert "freeze=False" in labels and "max_fusion_size=16" in labels
    assert any(lb.startswith("recomputation_threshold=") for lb in labels)
    # From an incumbent that switched a rule on, the knob for it switches it off again.
    again = [k.label for k in search.knobs(Options(), {"enabled_rules": frozenset({"attention_core"})})]
    assert "rule attention_core off" in again


def test_race_reports_noise_and_medians() -> None:
    slow_ms, fast_ms, noise = search.race(lambda: sum(range(20000)), lambda: None, rounds=5)
    assert slow_ms > fast_ms >= 0.0 and noise >= 0.0


def test_evaluate_drops_wrong_candidates_and_does_not_time_knobs_that_change_nothing() -> None:
    model, xs = _model()
    problem = search.Problem(model, xs, None, rounds=3)
    same = search.evaluate(problem, search.Job("no-op", "max_fusion_size", 63, {}, {"max_fusion_size": 63}))
    assert same.status == "same plan" and not same.wins
    timed = search.evaluate(problem, search.Job("sk", "super_kernel", "off", {}, {"super_kernel": "off"}))
    assert timed.status == "timed" and timed.incumbent_ms > 0 and timed.candidate_ms > 0
    problem.expected = problem.expected + 1.0  # now every candidate answers "wrongly"
    problem._built.clear()
    wrong = search.evaluate(problem, search.Job("bad", "freeze", False, {}, {"freeze": False}))
    assert wrong.status == "dropped" and "differs from the reference" in wrong.why


def _ev(
    job: search.Job, status: str, inc: float = 2.0, cand: float = 2.0, why: str = ""
) -> search.Evaluation:
    return search.Evaluation(job.label, job.option, job.value, job.candidate, status, why, inc, cand, 0.01)


def _winning_mapper(passes: list[list[str]]):
    def mapper(jobs: list[search.Job]):
        passes.append([j.label for j in jobs])
        for job in jobs:
            if job.label == "combined winners":
                yield _ev(job, "timed", 2.0, 1.0)  # both together: 2x
            elif job.label == "super_kernel=off" and "super_kernel" not in job.incumbent:
                yield _ev(job, "timed", 2.0, 1.6)  # 1.25x
            elif job.label == "freeze=False" and "freeze" not in job.incumbent:
                yield _ev(job, "timed", 2.0, 1.8)  # 1.11x
            elif job.label == "max_fusion_size=16":
                yield _ev(job, "dropped", why="ValueError: result differs")
            elif job.label == "max_fusion_size=32":
                yield _ev(job, "timed", 2.0, 1.98)  # 1% : below MIN_GAIN, not taken
            else:
                yield _ev(job, "same plan")

    return mapper


def _final_race(monkeypatch: pytest.MonkeyPatch, default_ms: float, tuned_ms: float) -> None:
    """The final race (default against tuned) gives these times; the search's own races are mapped."""
    real = search.race

    def race(a, b, rounds):
        if rounds == search.FINAL_ROUNDS:
            real(a, b, 1)  # both still run
            return default_ms, tuned_ms, 0.0
        return real(a, b, rounds)

    monkeypatch.setattr(search, "race", race)


def test_tuner_takes_only_wins_above_the_noise_and_combines_winners(monkeypatch) -> None:
    model, xs = _model()
    tuner = search.Tuner(model, xs, budget_s=1e9, rounds=3)
    passes: list[list[str]] = []
    _final_race(monkeypatch, 2.0, 1.0)
    result = tuner.run(mapper=_winning_mapper(passes))
    assert result.overrides == {"super_kernel": "off", "freeze": False}
    assert [(d.option, d.value, d.gain) for d in result.decisions] == [
        ("super_kernel", "off", 1.25), ("freeze", False, round(2.0 / 1.8, 4))
    ]  # fmt: skip
    assert ("max_fusion_size=16", "ValueError: result differs") in result.rejected
    assert len(passes) == 3 and passes[1] == ["combined winners"]  # pass, combination, a pass finding nothing
    assert tuner.record is not None and tuner.record.overrides == {"super_kernel": "off", "freeze": False}
    assert result.default_ms > 0 and result.tuned_ms > 0


def test_a_tuned_plan_that_loses_the_final_race_is_not_kept(monkeypatch) -> None:
    model, xs = _model()
    tuner = search.Tuner(model, xs, budget_s=1e9, rounds=3)
    _final_race(monkeypatch, 1.0, 1.02)  # the knob-by-knob wins do not hold against the default
    result = tuner.run(mapper=_winning_mapper([]))
    assert result.overrides == {} and result.decisions == [] and result.tuned_ms == result.default_ms
    assert any(label == "tuned plan" and "lost the final race" in why for label, why in result.rejected)
    assert tuner.record is not None and tuner.record.overrides == {}


def test_cli_tune_json_ends_with_one_line_and_stores_the_record(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path / "cache"))
    record = tmp_path / "records.jsonl"
    rc = main(
        ["tune", "builtin:softmax", "--budget", "0.001", "--rounds", "3", "--json", "--record", str(record)]
    )
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"default_ms", "tuned_ms", "record"} <= set(last) and last["record"] == str(record)
    assert last["default_ms"] > 0 and last["tuned_ms"] > 0
    data = json.loads(record.read_text().splitlines()[0])
    assert data["machine"] == tuning.machine_fingerprint() and data["format"] == tuning.FORMAT
    assert dataclasses.asdict(tuning.TuningRecord.from_json(data))["graph"] == data["graph"]


def test_explain_and_report_say_which_decisions_came_from_tuning(tmp_path, capsys, monkeypatch) -> None:
    from autofusion.tools.diagnose.report import collect, render_html
    from autofusion.tools.models.builtins import builtin

    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    model, xs = builtin("mlp")
    key = tuning.graph_hash(autofusion.compile(model, xs, tuning="off").graph)
    tuning.store(_record(key, {"disabled": ["gemm_epilogue"]}), Cache(tmp_path))
    assert main(["explain", "builtin:mlp"]) == 0
    assert "from tuning record" in capsys.readouterr().out
    data = collect(model, xs, "mlp", runs=2)
    assert data["tuning"]["decisions"][0]["option"] == "disabled"
    assert "Decisions from tuning" in render_html(data)


def _recording(mapper, seen: list):
    def run(jobs):
        out = list(mapper(jobs))
        seen.extend(out)
        return out

    return run


# Ray's workers are other processes, which conftest.py's pinned profile does not reach: both sides plan
# against this machine's cached measurement, so that they plan alike.
@pytest.mark.measured_hardware
def test_ray_tuning_on_a_local_cluster_matches_the_local_tuner(monkeypatch) -> None:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'autofusion[distributed]')")
    from autofusion.tools.tune import distributed

    # No gain is large enough, so both searches take nothing and walk the same knobs: every evaluation's
    # status (same plan, timed, dropped) must agree, and so must the records.
    monkeypatch.setattr(search, "MIN_GAIN", 1e9)
    model, xs = _model()
    local = search.Tuner(model, xs, budget_s=1e9, rounds=3)
    seen_local: list[search.Evaluation] = []
    base_mapper = local.local_mapper(None)
    local_result = local.run(
        mapper=lambda jobs: seen_local.extend(base_mapper(jobs)) or seen_local[-len(jobs) :]
    )
    ray.init(num_cpus=2, resources={distributed.machine_resource(): 1}, log_to_driver=False)
    try:
        assert distributed.connect("auto") == 1
        remote = search.Tuner(model, xs, budget_s=1e9, rounds=3)
        seen_remote: list[search.Evaluation] = []
        ray_map = distributed.ray_mapper(remote.problem, 1)
        remote_result = remote.run(
            mapper=lambda jobs: seen_remote.extend(ray_map(jobs)) or seen_remote[-len(jobs) :]
        )
    finally:
        ray.shutdown()
    assert [(e.label, e.status) for e in seen_remote] == [(e.label, e.status) for e in seen_local]
    assert any(e.status == "timed" for e in seen_remote)  # the remote side really measured
    assert remote_result.overrides == local_result.overrides == {}
    assert remote.record is not None and local.record is not None
    assert remote.record.key() == local.record.key()


def test_ray_refuses_a_cluster_without_nodes_of_this_machine() -> None:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'autofusion[distributed]')")
    from autofusion.tools.tune import distributed

    ray.init(num_cpus=1, log_to_driver=False)
    try:
        with pytest.raises(distributed.RayUnavailable, match="ray start --address"):
            distributed.connect("auto")
    finally:
        ray.shutdown()


def test_a_wrong_default_plan_is_a_clear_error_and_rtol_is_taken(tmp_path, monkeypatch) -> None:
    from autofusion.tools.tune import search

    model, inputs = autofusion.builtin("softmax")
    tuner = search.Tuner(model, inputs, {"cache_dir": str(tmp_path)}, budget_s=1.0, rounds=3, rtol=0.5)
    assert tuner.problem.tolerance == 0.5
    strict = search.Tuner(model, inputs, {"cache_dir": str(tmp_path)}, budget_s=1.0, rounds=3, rtol=0.0)
    # Rounding differences of a softmax exceed 0 (or the results are equal and 0 passes): force a miss.
    strict.problem.expected = strict.problem.expected + 1.0
    with pytest.raises(search.DefaultPlanWrong, match="--rtol"):
        strict.run()
