"""`autofusion.save(compiled, path)`: a compiled model's plans, libraries and (optionally) weights, one file.

In: a `CompiledModel` (what `autofusion.compile` returns) with at least one compiled signature. Out: a
zip file (`package/__init__.py` lists its members). Each signature keeps its captured graph (how inputs
bind and outputs rebuild), its plan, SuperKernel plan, kernel parameters and fold split, which linear
weights ran prepacked on which library route, and what its first call computed from the weights alone
(`warm.py`: folded values, oneDNN-packed weights), so that loading need not compute it again.
Signatures that ran eagerly are listed in the manifest, not saved.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from autofusion.api import CompiledGraph, CompiledModel, TorchSource
from autofusion.codegen.cpp import dnnl_conv
from autofusion.codegen.cpp.build import CompilerConfig, compiler_version, resolved_features
from autofusion.errors import BuildError, PackageError
from autofusion.hw.isa import host_model
from autofusion.ir.targets import RULES_NAMESPACE
from autofusion.package import manifest as mf
from autofusion.package import pickling, tensorfile, warm
from autofusion.plan.schedule import OpStep
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.prepack import packed_call
from autofusion.runtime.super_executor import SuperExecutor

WEIGHT_MODES = ("reference", "copy")
RouteTable = dict[tuple[int, int, int, torch.dtype], str]


def _routes(cg: CompiledGraph) -> RouteTable | None:
    """The library route each prepacked linear shape ran (None: the plan took no route chooser)."""
    program = cg.program
    assert program is not None
    if not program.stats.get("freeze", {}).get("on"):
        return None
    prepacked: dict[str, str] = dict(getattr(program.executor, "prepacked", {}))
    graph = program.plan.graph
    types = graph.value_types()
    table: RouteTable = {}
    for step in program.plan.steps:
        if isinstance(step, OpStep) and step.node.name in prepacked:
            seen: list[tuple[int, int, int, torch.dtype]] = []

            def record(m: int, k: int, n: int, dtype: torch.dtype, seen: list[Any] = seen) -> str:
                seen.append((m, k, n, dtype))
                return "onednn"  # any packed route: packed_call then reports the shape it asked for

            packed_call(step.node, graph, types, record)
            for sig in seen:
                table[sig] = prepacked[step.node.name]
    return table


def _program_record(
    cg: CompiledGraph, libraries: dict[str, Path], weights_copied: bool, exported: dict[int, Any]
) -> dict[str, Any] | None:
    program = cg.program
    if program is None:
        return None
    routes = _routes(cg)
    ex = program.executor
    split = ex.split if isinstance(ex, FoldedExecutor) else None
    inner = ex.inner if isinstance(ex, FoldedExecutor) else ex
    key = None
    if program.library is not None:
        so = Path(program.library._name)
        key = so.parent.name
        libraries[key] = so
    if isinstance(inner, SuperExecutor):
        kind, entries = "super", inner.entries
    else:
        kind, entries = ("plan" if program.library is not None else "reference"), ()
    return {
        "kind": kind, "plan": program.plan, "super_plan": program.super_plan if kind == "super" else None,
        "entries": entries, "params": program.params, "source": program.source, "stats": program.stats,
        "split": split, "library": key, "routes": routes,
        "warm": warm.capture(program, warm.bound_inputs(cg.captured.sources), weights_copied, routes,
                             exported),
    }  # fmt: skip


def _library_record(so: Path, cxx: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    meta_bytes = (so.parent / "meta.json").read_bytes()
    meta = json.loads(meta_bytes)
    features = meta.get("features")
    if features is None:  # built by a version that did not record them: ask the compiler that built it
        try:
            features = list(resolved_features(CompilerConfig(cxx=meta.get("compiler", cxx))))
        except BuildError as e:
            raise PackageError(f"cannot tell which CPU features {so} was built for: {e}") from e
    record = {
        "file": f"{mf.LIBS}/{so.parent.name}/{so.name}", "sha256": meta.get("so_sha256"),
        "features": features, "flags": meta.get("flags", []), "compiler": meta.get("compiler"),
        "compiler_version": meta.get("compiler_version"),
    }  # fmt: skip
    return record, {so.name: so.read_bytes(), "meta.json": meta_bytes}


def save(compiled: Any, path: str | os.PathLike[str], weights: str = "reference") -> Path:
    """Write `compiled` (from `autofusion.compile`) to `path` as one package file; returns the path.

    `weights="reference"`: the model's parameters and buffers are not stored; `load(path, model=m)`
    binds them by name from `m`. `weights="copy"`: they are stored too, so `load(path)` needs no model.
    ONNX models keep their initializers inside the plan either way."""
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {', '.join(map(repr, WEIGHT_MODES))}, got {weights!r}")
    if not isinstance(compiled, CompiledModel):
        got = type(compiled).__name__
        raise PackageError(f"autofusion.save takes what autofusion.compile returns, got {got} "
                           "(torch.compile(backend='autofusion') artefacts cannot be saved)")  # fmt: skip
    source = compiled.source
    is_torch = isinstance(source, TorchSource)
    libraries: dict[str, Path] = {}
    saved: list[tuple[Any, dict[str, Any]]] = []
    exported: dict[int, Any] = {}  # packed weight id -> its bytes: one copy for signatures sharing it
    eager: list[str] = []
    last = None
    for sig, entry in compiled.entries():
        if isinstance(entry, str):
            eager.append(f"{source.signature_text(sig)}: {entry}")
            continue
        if entry is compiled.last:
            last = len(saved)
        program = _program_record(entry, libraries, is_torch and weights == "copy", exported)
        saved.append((sig, {"captured": entry.captured, "program": program}))
    if not saved:
        raise PackageError(f"{source.name}: nothing compiled to save; call the model once or pass "
                           "example_inputs to autofusion.compile first")  # fmt: skip
    body = {
        "options": compiled.options, "contract": compiled.contract, "signatures": saved, "last": last,
        "arity": getattr(source, "arity", None), "mode": getattr(source, "mode", "auto"),
    }  # fmt: skip
    try:
        data, tensors, live, targets, calls = pickling.dump(body)
    except (TypeError, AttributeError, pickle.PicklingError) as e:
        raise PackageError(f"{source.name}: the compiled plan cannot be saved: {e}") from e
    model = compiled.model if is_torch else None
    live_info: dict[str, dict[str, Any]] = {}
    copies: dict[str, torch.Tensor] = {}
    for _, entry in compiled.entries():
        if isinstance(entry, str):
            continue
        for kind, ref in entry.captured.sources:
            if kind == "live" and ref.target in live:
                t = ref.get()
                live_info[ref.target] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                                         "buffer": live[ref.target]}  # fmt: skip
                copies[ref.target] = t.detach()
    glue = _dnnl_glue(calls, libraries)
    lib_records: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    for key, so in sorted(libraries.items()):
        record, lib_files = _library_record(so, compiled.options.cxx)
        lib_records[key] = record
        for name, blob in lib_files.items():
            files[f"{mf.LIBS}/{key}/{name}"] = blob
    cxx = compiled.options.cxx
    manifest = {
        **mf.environment(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host_cpu": host_model(),
        "compiler": {
            "cxx": cxx,
            "version": _version_or_none(cxx) if libraries else None,
            "flags": list(CompilerConfig().flags),
        },
        "source": {
            "kind": "torch" if is_torch else "onnx",
            "name": source.name,
            "model": type(model).__name__ if model is not None else None,
        },
        "weights": weights if is_torch else "inside",
        "live_weights": live_info,
        "signatures": [source.signature_text(sig) for sig, _ in saved],
        "eager_signatures": eager,
        "libraries": lib_records,
        "extern_modules": pickling.target_modules(targets),  # imported by `load` before anything runs
        "dnnl_glue": glue,  # one of `libraries`: installed and handed to the "dnnl" conv route at load
    }
    manifest["cpu_features"] = mf.required_features(manifest)
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with zipfile.ZipFile(tmp, "w") as z:
            z.writestr(mf.MANIFEST, json.dumps(manifest, indent=1) + "\n", zipfile.ZIP_DEFLATED)
            z.writestr(mf.PLAN, data, zipfile.ZIP_DEFLATED)
            tensorfile.write(z, tensors, copies if weights == "copy" else {})
            for name, blob in files.items():
                z.writestr(name, blob, zipfile.ZIP_DEFLATED)
        os.replace(tmp, out)  # a reader sees the old package or the new one, never half of one
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _dnnl_glue(calls: set[tuple[str, str]], libraries: dict[str, Path]) -> dict[str, str] | None:
    """The oneDNN convolution glue, added to `libraries`, when a saved graph calls conv_bn_act on its
    "dnnl" route and this process loaded the glue: a process with no compiler could not build it, and
    the route would fall back to "onednn" (slower: a primitive created per call)."""
    if (f"{RULES_NAMESPACE}.conv_bn_act.default", "dnnl") not in calls:
        return None
    glue = dnnl_conv.loaded()
    if glue is None:
        return None
    so = Path(glue.cdll._name)
    libraries[so.parent.name] = so
    return {"key": so.parent.name, "onednn": glue.install.version, "include": str(glue.install.include),
            "lib": str(glue.install.lib)}  # fmt: skip


def _version_or_none(cxx: str) -> str | None:
    try:
        return compiler_version(cxx)
    except BuildError:
        return None
