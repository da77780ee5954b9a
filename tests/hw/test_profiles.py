"""Hardware profiles: built-ins, user YAML, overrides, error messages, the measured and cached cpu profile."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import pickle
from pathlib import Path

import pytest

from autofusion.errors import CompilerError
from autofusion.hw import BUILTIN_PROFILES, HardwareProfile, ProfileError, load_profile, measure
from autofusion.hw.measure import cache_sizes

# The measurement and its cache are what this file tests (conftest.py pins the profile elsewhere).
pytestmark = pytest.mark.measured_hardware

MINIMAL = """\
name: mine
kind: gpu
memory_bandwidth: 1.0e+12
dispatch_overhead_s: 3.0e-6
on_chip_bytes: 102400
cores: 80
vector_bytes: 16
alignment: 128
peak_flops:
  fp32: 2.0e+13
"""

FAKE_MEASUREMENT = {
    "memory_bandwidth": 3.0e10, "dispatch_overhead_s": 2e-6, "cores": 7, "l2_bytes": 1 << 21,
    "on_chip_bytes": 1 << 21, "l1_bytes": 49152, "l3_bytes": 1 << 25, "vector_bytes": 32,
}  # fmt: skip


class FakeLoad:
    """What hw/busy.py reports: `others` cores used by other processes while the cpu is measured, and
    whether the machine is busy when a compile looks again (`busy`); counts the looks."""

    def __init__(self) -> None:
        self.others: float | None = 0.0
        self.busy = False
        self.looks = 0

    def during(self, fn):  # type: ignore[no-untyped-def]
        return fn(), self.others

    def machine_busy(self) -> tuple[bool, str]:
        self.looks += 1
        return self.busy, "other processes use 1.6 cores" if self.busy else "other processes use 0.0 cores"


@pytest.fixture(autouse=True)
def load(monkeypatch: pytest.MonkeyPatch) -> FakeLoad:
    """A quiet machine unless a test says otherwise (the real reading depends on what else runs), and a
    fresh process as far as re-checks and warnings go."""
    fake = FakeLoad()
    monkeypatch.setattr(measure, "others_cores_during", fake.during)
    monkeypatch.setattr(measure, "machine_busy", fake.machine_busy)
    monkeypatch.setattr(measure, "_next_recheck", {})
    monkeypatch.setattr(measure, "_warned", set())
    return fake


@pytest.fixture
def count_measurements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def fake_measure_cpu(**kwargs: object) -> dict:
        calls.append(1)
        return dict(FAKE_MEASUREMENT)

    monkeypatch.setattr(measure, "measure_cpu", fake_measure_cpu)
    return calls


def write(tmp_path: Path, text: str, name: str = "mine.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- built-ins ----


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtins_load_without_measuring(name: str, count_measurements: list[int]) -> None:
    p = load_profile(name, measure=False)
    assert isinstance(p, HardwareProfile) and p.name == name
    assert p.budget_bytes == int(p.on_chip_bytes * 0.8)
    assert p.memory_bandwidth > 0 and p.dispatch_overhead_s > 0 and p.cores > 0
    assert {"fp32", "fp16", "bf16"} <= set(p.peak_flops)
    assert set(p.source) == {k for k, v in p.to_dict().items() if v is not None} - {"name", "kind", "source"}
    assert p.describe().startswith(f"{name} ({p.kind}): ")
    assert count_measurements == []


def test_ascend910b_ub_budget() -> None:
    p = load_profile("ascend910b", measure=False)
    assert (p.kind, p.on_chip_bytes, p.budget_fraction) == ("npu", 196352, 0.8)
    assert p.budget_bytes == int(196352 * 0.8) == 157081
    assert (p.cores, p.vector_bytes, p.alignment) == (24, 256, 32)
    assert p.datasheet_bandwidth == 1.6e12 and p.memory_bandwidth < p.datasheet_bandwidth
    assert p.source["on_chip_bytes"] == "datasheet"


def test_h200_fields() -> None:
    p = load_profile("h200", measure=False)
    assert (p.kind, p.cores, p.on_chip_bytes, p.l2_bytes) == ("gpu", 132, 228 * 1024, 50 * 1024 * 1024)
    assert (p.memory_bandwidth, p.datasheet_bandwidth) == (4.3e12, 4.8e12)
    assert p.peak_flops["fp16"] == p.peak_flops["bf16"] == 989e12 and p.peak_flops["fp32"] == 67e12
    assert (p.alignment, p.vector_bytes) == (128, 16)
    assert p.source["memory_bandwidth"] == "measured" and p.source["datasheet_bandwidth"] == "datasheet"


def test_cpu_defaults_without_cache_dir_do_not_measure(count_measurements: list[int]) -> None:
    p = load_profile("cpu")  # measure=True, but nowhere to cache: the defaults stand
    assert count_measurements == []
    assert p.kind == "cpu" and p.alignment == 64 and set(p.source.values()) == {"default"}


def test_profile_is_frozen_hashable_and_copyable() -> None:
    p = load_profile("h200", measure=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cores = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="read-only"):
        p.peak_flops["fp32"] = 1.0  # type: ignore[index]
    assert hash(p) == hash(load_profile("h200", measure=False))
    assert pickle.loads(pickle.dumps(p)) == p == copy.deepcopy(p)
    assert json.loads(json.dumps(p.to_dict()))["peak_flops"]["fp32"] == 67e12
    assert dataclasses.replace(p, cores=66).cores == 66


# ---- overrides and user files ----


def test_overrides_replace_fields_and_are_marked() -> None:
    p = load_profile("h200", measure=False, overrides={"on_chip_bytes": 100_000, "budget_fraction": 0.5})
    assert p.budget_bytes == 50_000
    assert p.source["on_chip_bytes"] == p.source["budget_fraction"] == "override"
    assert p.source["cores"] == "datasheet" and "override: on_chip_bytes, budget_fraction" in p.describe()
    with pytest.raises(ProfileError, match=r"override 'memory_bandwith'.*did you mean 'memory_bandwidth'"):
        load_profile("h200", measure=False, overrides={"memory_bandwith": 1e12})
    with pytest.raises(ProfileError, match=r"override cores: must be a positive number"):
        load_profile("h200", measure=False, overrides={"cores": -1})
    with pytest.raises(ProfileError, match=r"override alignment: must be a power of two"):
        load_profile("h200", measure=False, overrides={"alignment": 48})


def test_user_yaml_file(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("1.0e+12", "1.0e12"))  # YAML 1.1 reads 1.0e12 as a string
    p = load_profile(str(path))
    assert (p.name, p.memory_bandwidth, p.budget_fraction, p.l2_bytes) == ("mine", 1e12, 0.8, None)
    assert set(p.source.values()) == {"default"}
    unnamed = write(tmp_path, MINIMAL.replace("name: mine\n", ""), "a100ish.yml")
    assert load_profile(unnamed).name == "a100ish"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("fp32: 2.0e+13", "fp32: 2.0e+13\nmemory_bandwith: 1"),
            r"mine\.yaml:11: unknown key 'memory_bandwith' \(did you mean 'memory_bandwidth'\?\)",
        ),
        (("cores: 80", "cores: many"), r"mine\.yaml:6: key 'cores': expected a number, got 'many'"),
        (("cores: 80", "cores: 2.5"), r"mine\.yaml:6: key 'cores': expected a whole number"),
        (
            ("1.0e+12", "-1.0e+12"),
            r"mine\.yaml:3: key 'memory_bandwidth': must be a positive number, got -1e\+12",
        ),
        (("fp32: 2.0e+13", "fp32: -5"), r"mine\.yaml:10: key 'peak_flops\.fp32': must be a positive number"),
        (("fp32: 2.0e+13", "float32: 1"), r"mine\.yaml:10: key 'peak_flops\.float32': unknown key .*'fp32'"),
        (("kind: gpu", "kind: tpu"), r"mine\.yaml:2: key 'kind': expected one of cpu, npu, gpu"),
        (
            ("fp32: 2.0e+13", "fp32: 2.0e+13\nbudget_fraction: 1.5"),
            r"mine\.yaml:11: key 'budget_fraction': must be in \(0, 1\]",
        ),
        (
            ("fp32: 2.0e+13", "fp32: 2.0e+13\ncores: 81"),
            r"mine\.yaml:11: key 'cores' appears twice \(first on line 6\)",
        ),
        (("cores: 80\n", ""), r"mine\.yaml: missing key\(s\) 'cores'"),
        (
            ("fp32: 2.0e+13", "fp32: 2.0e+13\nmeasured: [cores]"),
            r"mine\.yaml:11: key 'measured': only a 'cpu' profile",
        ),
        (
            ("fp32: 2.0e+13", "fp32: 2.0e+13\nsource: {cores: guessed}"),
            r"mine\.yaml:11: key 'source\.cores': expected one of",
        ),
        (("cores: 80", "cores: [80"), r"mine\.yaml: not valid YAML"),
    ],
)
def test_bad_yaml_names_file_line_and_key(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    path = write(tmp_path, MINIMAL.replace(*change, 1))
    with pytest.raises(ProfileError, match=expected) as info:
        load_profile(path)
    assert isinstance(info.value, ValueError) and isinstance(info.value, CompilerError)


def test_yaml_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"list\.yaml: expected a mapping"):
        load_profile(write(tmp_path, "- cores: 1\n", "list.yaml"))


def test_unknown_name_suggests_and_lists_known() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown hardware profile 'h20' \(did you mean 'h200'\?\); known: cpu, ascend910b, h200",
    ):
        load_profile("h20")
    assert load_profile("H200", measure=False).name == "h200"
    with pytest.raises(ProfileError, match=r"nowhere\.yaml does not exist"):
        load_profile("nowhere.yaml")


# ---- the measured cpu profile ----


def test_cpu_is_measured_once_then_read_from_cache(tmp_path: Path, count_measurements: list[int]) -> None:
    first = load_profile("cpu", cache_dir=tmp_path)
    assert count_measurements == [1]
    assert (first.memory_bandwidth, first.cores, first.on_chip_bytes) == (3.0e10, 7, 1 << 21)
    assert first.source["memory_bandwidth"] == first.source["cores"] == "measured"
    assert first.source["alignment"] == "default"
    assert len(_records(tmp_path)) == 1
    second = load_profile("cpu", cache_dir=tmp_path)
    assert count_measurements == [1] and second == first
    override = load_profile("cpu", cache_dir=tmp_path, overrides={"cores": 1})
    assert (override.cores, override.source["cores"]) == (1, "override")
    assert load_profile("cpu", cache_dir=tmp_path, measure=False).cores == 4
    assert count_measurements == [1]


def test_corrupt_or_foreign_cache_is_measured_again(
    tmp_path: Path, count_measurements: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    load_profile("cpu", cache_dir=tmp_path)
    (cache_file,) = _records(tmp_path)
    cache_file.write_text("{ not json")
    load_profile("cpu", cache_dir=tmp_path)
    assert count_measurements == [1, 1]
    stored = json.loads(cache_file.read_text())
    stored["value"]["key"] = "another machine"
    cache_file.write_text(json.dumps(stored))
    load_profile("cpu", cache_dir=tmp_path)
    assert count_measurements == [1, 1, 1]
    stored = json.loads(cache_file.read_text())
    stored["value"]["values"]["memory_bandwidth"] = float("inf")  # hand-edited nonsense is not trusted either
    cache_file.write_text(json.dumps(stored))
    load_profile("cpu", cache_dir=tmp_path)
    assert count_measurements == [1, 1, 1, 1]
    monkeypatch.setattr(measure, "machine_key", lambda: "a different cpu")  # another machine: its own record
    load_profile("cpu", cache_dir=tmp_path)
    assert count_measurements == [1, 1, 1, 1, 1] and len(_records(tmp_path)) == 2


def test_measurement_in_the_old_cache_layout_is_kept(tmp_path: Path, count_measurements: list[int]) -> None:
    record = {"version": measure.CACHE_VERSION, "key": measure.machine_key(), "measured_at": 0.0,
              "seconds": 0.5, "values": FAKE_MEASUREMENT}  # fmt: skip
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "cpu-0123456789abcdef.json").write_text(json.dumps(record))
    assert load_profile("cpu", cache_dir=tmp_path).cores == 7
    assert count_measurements == [] and len(_records(tmp_path)) == 1
    assert (tmp_path / "hw" / "cpu-0123456789abcdef.json").is_file()  # left for older versions


def test_a_busy_measurement_is_marked_and_measured_again_once_quiet(
    tmp_path: Path,
    count_measurements: list[int],
    load: FakeLoad,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load.others = 1.4  # another process held most of a core while the bandwidth was timed
    with caplog.at_level(logging.WARNING, logger="autofusion.hw.measure"):
        p = load_profile("cpu", cache_dir=tmp_path)
        assert p.memory_bandwidth == 3.0e10 and count_measurements == [1]
        (record,) = [json.loads(f.read_text())["value"] for f in _records(tmp_path)]
        assert record["quiet"] is False and record["others_cores"] == 1.4
        # This process measured just now: the next compiles use the record without looking at the load.
        load.busy = False
        for _ in range(3):
            assert load_profile("cpu", cache_dir=tmp_path) == p
        assert count_measurements == [1] and load.looks == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "while other processes used 1.4 cores" in warnings[0].getMessage()
    # A new process (or this one RECHECK_S later) finds the machine still busy: it keeps the record,
    # warns once and does not look again before RECHECK_S.
    monkeypatch.setattr(measure, "_next_recheck", {})
    monkeypatch.setattr(measure, "_warned", set())
    load.busy = True
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autofusion.hw.measure"):
        for _ in range(3):
            assert load_profile("cpu", cache_dir=tmp_path) == p
    assert count_measurements == [1] and load.looks == 1
    assert len([r for r in caplog.records if "measured on a busy machine" in r.getMessage()]) == 1
    # Later, quiet: measured again, marked quiet, and never looked at again.
    clock = measure.time.monotonic() + measure.RECHECK_S + 1
    monkeypatch.setattr(measure.time, "monotonic", lambda: clock)
    load.busy, load.others = False, 0.1
    assert load_profile("cpu", cache_dir=tmp_path) == p
    assert count_measurements == [1, 1] and load.looks == 2
    (record,) = [json.loads(f.read_text())["value"] for f in _records(tmp_path)]
    assert record["quiet"] is True and record["others_cores"] == 0.1
    monkeypatch.setattr(measure, "_next_recheck", {})
    assert load_profile("cpu", cache_dir=tmp_path) == p
    assert count_measurements == [1, 1] and load.looks == 2


def test_unknown_load_falls_back_to_the_busy_check(tmp_path: Path, count_measurements: list[int],
                                                   load: FakeLoad) -> None:  # fmt: skip
    load.others, load.busy = None, True  # no /proc/stat: the load average decides
    load_profile("cpu", cache_dir=tmp_path)
    (record,) = [json.loads(f.read_text())["value"] for f in _records(tmp_path)]
    assert record["quiet"] is False and record["others_cores"] is None


def _records(root: Path) -> list[Path]:
    return sorted((root / "hw").glob("*/*.json"))


def test_real_measurement_is_plausible_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No wall-clock limits here (machines are noisy); the cache is shown to work by counting measurements.
    p = load_profile("cpu", cache_dir=tmp_path)
    assert p.memory_bandwidth > 1e9, p.describe()
    assert 0 < p.dispatch_overhead_s < 1e-3, p.describe()
    assert p.cores >= 1 and p.source["memory_bandwidth"] == "measured"
    monkeypatch.setattr(measure, "measure_cpu", lambda: pytest.fail("a cached profile was measured again"))
    assert load_profile("cpu", cache_dir=tmp_path) == p


def test_cache_sizes_from_sysfs(tmp_path: Path) -> None:
    """An L2 shared by a 4-core cluster (with SMT siblings) gives each physical core a quarter."""

    def put(rel: str, text: str) -> None:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text + "\n")

    for i, (level, kind, size, shared) in enumerate(
        [
            (1, "Data", "48K", "0,8"),
            (1, "Instruction", "32K", "0,8"),
            (2, "Unified", "2048K", "0-3,8-11"),
            (3, "Unified", "36M", "0-15"),
        ]
    ):
        for name, value in (
            ("level", str(level)),
            ("type", kind),
            ("size", size),
            ("shared_cpu_list", shared),
        ):
            put(f"cpu0/cache/index{i}/{name}", value)
    for cpu in range(16):
        put(f"cpu{cpu}/topology/physical_package_id", "0")
        put(f"cpu{cpu}/topology/core_id", str(cpu % 8))
    got = cache_sizes(tmp_path)
    assert got == {
        "l1_bytes": 48 << 10,
        "l2_bytes": 2 << 20,
        "l3_bytes": 36 << 20,
        "on_chip_bytes": 512 << 10,
    }
