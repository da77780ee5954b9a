"""A package for another machine or version is refused before anything in it runs (never a SIGILL), or
compiled anew when the model and a compiler are here; the disk cache's keys carry the resolved CPU
features, so a cache shared between machines cannot hand out a library built for another ISA."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import autofusion
from autofusion.codegen.cpp import build as build_mod
from autofusion.codegen.cpp.build import CompilerConfig, build, cache_key, resolved_features
from autofusion.errors import PackageError
from autofusion.hw import isa

pytestmark = pytest.mark.skipif(os.system("g++ --version > /dev/null 2>&1") != 0, reason="needs g++")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, tuple[torch.Tensor, ...]]:
    model, inputs = autofusion.builtin("elementwise-chain")
    with torch.no_grad():
        cm = autofusion.compile(model, inputs)
        cm(*inputs)
    assert cm.stats["generated_calls"] > 0
    path = tmp_path_factory.mktemp("refusal") / "chain.afpkg"
    autofusion.save(cm, path)
    return path, model, inputs


def _edited(src: Path, dst: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the package `src` whose manifest `change` edited."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "manifest.json":
                manifest = json.loads(data)
                change(manifest)
                data = json.dumps(manifest).encode()
            zout.writestr(item, data)
    return dst


def _claim_feature(manifest: dict[str, Any]) -> None:
    for lib in manifest["libraries"].values():
        lib["features"] = [*lib["features"], "avx9999_fictional"]


def test_the_unedited_package_loads(package: tuple[Path, Any, Any]) -> None:
    path, model, inputs = package
    cm = autofusion.load(path)
    with torch.no_grad():
        assert torch.allclose(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)
    assert cm.stats["package"] == str(path)


def test_a_feature_this_cpu_lacks_is_refused(package: tuple[Path, Any, Any], tmp_path: Path) -> None:
    foreign = _edited(package[0], tmp_path / "foreign.afpkg", _claim_feature)
    with pytest.raises(PackageError, match="CPU features this machine lacks: avx9999_fictional") as info:
        autofusion.load(foreign)
    assert "illegal instruction" in str(info.value) and "Refused" in str(info.value)


def test_a_needed_feature_missing_here_is_refused(
    package: tuple[Path, Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same check from the other side: this machine lacks a feature the kernels were built for."""
    with zipfile.ZipFile(package[0]) as z:
        needed = json.loads(z.read("manifest.json"))["cpu_features"]
    assert needed, "the package records the features its kernels use"
    dropped = "avx2" if "avx2" in needed else needed[-1]
    here = isa.host_features()
    monkeypatch.setattr(isa, "host_features", lambda: here - {dropped})
    with pytest.raises(PackageError, match=f"lacks: {dropped}"):
        autofusion.load(package[0])


def test_with_the_model_and_a_compiler_it_is_compiled_here(
    package: tuple[Path, Any, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, model, inputs = package
    foreign = _edited(path, tmp_path / "foreign.afpkg", _claim_feature)
    caplog.set_level(logging.WARNING, logger="autofusion.package")
    cm = autofusion.load(foreign, model=model)
    with torch.no_grad():
        assert torch.allclose(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)
    assert "package" not in cm.stats and cm.stats["generated_calls"] > 0  # compiled here, kernels ran
    assert "compiling the model here instead" in caplog.text
    with pytest.raises(PackageError, match="lacks"):  # the model but no compiler: refused
        autofusion.load(foreign, model=model, cxx=str(tmp_path / "no-such-g++"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("torch", "1.0.0", "saved with torch 1.0.0"),
        ("autofusion", "0.0.1", "saved with autofusion 0.0.1"),
        ("format_version", 99, "package format version 99"),
        ("machine", "riscv128", "machine architecture riscv128"),
    ],
)
def test_other_versions_are_refused(
    package: tuple[Path, Any, Any], tmp_path: Path, key: str, value: Any, message: str
) -> None:
    def change(m: dict[str, Any]) -> None:
        m[key] = value

    with pytest.raises(PackageError, match=message):
        autofusion.load(_edited(package[0], tmp_path / "other.afpkg", change))


def test_a_damaged_library_is_refused(package: tuple[Path, Any, Any], tmp_path: Path) -> None:
    """The library's sha256 (its meta.json) is checked before it is opened."""
    src, dst = package[0], tmp_path / "damaged.afpkg"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith(".so"):
                data = data[:-16] + bytes(16)
            zout.writestr(item, data)
    with pytest.raises(PackageError, match="cannot open its library"):
        autofusion.load(dst, cache_dir=str(tmp_path / "cache"))
    assert not list((tmp_path / "cache").glob("kernels/*/*/*.so")), "a damaged library stayed in the cache"


def test_not_a_package(tmp_path: Path) -> None:
    junk = tmp_path / "junk.afpkg"
    junk.write_bytes(b"not a zip file")
    with pytest.raises(PackageError, match="cannot read the package"):
        autofusion.load(junk)
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(PackageError, match="not an autofusion package"):
        autofusion.load(tmp_path / "other.zip")


# ---- CPU features: what a build uses, what the cache key holds ----


def test_macros_map_to_cpuinfo_flags() -> None:
    names = ("AVX2", "SSE4_1", "SSE3", "FMA", "CRC32", "SSE_MATH", "BMI")
    macros = "\n".join(f"#define __{m}__ 1" for m in names)
    host = {"avx2", "sse4_1", "pni", "fma", "bmi1", "avx512f", "constant_tsc"}
    need = isa.required_features(isa.macro_features(macros + "\n#define __LP64__ 1\n"), host)
    # CRC32 and SSE_MATH have no cpuinfo flag; avx512f was not announced; constant_tsc is no ISA feature.
    assert need == ("avx2", "bmi1", "fma", "pni", "sse4_1")
    assert isa.missing_features(need, {"avx2", "fma", "pni", "sse4_1"}) == ["bmi1"]
    assert isa.missing_features(need, host) == []


def test_arm_features_and_cpuinfo_parsing() -> None:
    text = "processor\t: 0\nFeatures\t: fp asimd asimddp sve\nCPU implementer\t: 0x41\n\nprocessor\t: 1\n"
    host = isa.parse_cpuinfo(text)
    assert host == {"fp", "asimd", "asimddp", "sve"}
    macros = "#define __ARM_NEON 1\n#define __ARM_FEATURE_SVE 1\n#define __ARM_FEATURE_DOTPROD 1\n"
    assert isa.required_features(isa.macro_features(macros), host) == ("asimd", "asimddp", "sve")


def test_resolved_features_follow_the_flags() -> None:
    native = set(resolved_features(CompilerConfig()))
    baseline = set(resolved_features(CompilerConfig(flags=("-O2", "-march=x86-64"))))
    assert baseline <= native and "sse2" in baseline and "avx2" not in baseline
    assert native <= isa.host_features()  # -march=native never asks for more than this CPU has


def test_cache_key_changes_with_the_cpu_features(monkeypatch: pytest.MonkeyPatch) -> None:
    src = 'extern "C" int one() { return 1; }\n'
    config = CompilerConfig()
    key = cache_key(src, config)
    real = build_mod.resolved_features(config)
    monkeypatch.setattr(build_mod, "resolved_features", lambda c: tuple(f for f in real if f != "avx2"))
    assert cache_key(src, config) != key
    monkeypatch.setattr(build_mod, "resolved_features", lambda c: (*real, "avx9999_fictional"))
    assert cache_key(src, config) != key
    monkeypatch.setattr(build_mod, "resolved_features", lambda c: real)
    assert cache_key(src, config) == key
    other = dataclasses.replace(config, flags=(*config.flags, "-mno-avx512f"))
    assert cache_key(src, other) != key  # other flags, other features (and flags are keyed anyway)


def test_meta_json_records_the_features(tmp_path: Path) -> None:
    src = 'extern "C" int two() { return 2; }\n'
    lib = build(src, CompilerConfig(), tmp_path / "cache")
    meta = json.loads((lib.entry_dir / "meta.json").read_text())
    assert meta["features"] == list(resolved_features(CompilerConfig())) and meta["machine"]
