"""`autofusion.load(path, model=None)`: a saved package as a `CompiledModel`, with no capture and no compiler.

In: the package file and, optionally, the model (the nn.Module whose weights a `weights="reference"`
package reads, or the ONNX model; either also lets new signatures compile). Out: a `CompiledModel` whose
saved signatures run at once: each library is put into the disk cache under its key (checked by sha256)
and opened, and each executor is built again from its saved plan. Folded weights and oneDNN-packed
linear weights the package stored (`warm.py`) are put back where they cannot be stale (the weights are
the package's own, the CPU features match); the rest is computed on the first call, as after a compile.

Refusals (`manifest.refusal`: another package format, autofusion or torch version, machine, or CPU
features this machine lacks) raise `PackageError` before anything is unpickled or opened, unless the
model is given and a C++ compiler runs here: then the model is compiled here instead (logged at WARNING).
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import operator
import os
import zipfile
from collections.abc import Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autofusion.api import CompiledGraph, CompiledModel, TorchSource, is_onnx_source
from autofusion.codegen.cpp import dnnl_conv
from autofusion.codegen.cpp.build import compiler_version, install
from autofusion.codegen.cpp.build import load as open_library
from autofusion.config import Options
from autofusion.errors import BuildError, InputMismatchError, PackageError
from autofusion.frontend.source import Captured, Source, as_tensor
from autofusion.frontend.torch.live import LiveTensor
from autofusion.package import manifest as mf
from autofusion.package import pickling, tensorfile, warm
from autofusion.plan.superkernel import SuperPlan, dnnl_handles
from autofusion.runtime import dnnl_route
from autofusion.runtime.executor import PlanExecutor
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.program import Program, cache_for
from autofusion.runtime.super_executor import SuperExecutor

log = logging.getLogger("autofusion.package")

# Options that describe this machine and this run, not the compiled plan: taken from here, not the package.
LOCAL_OPTIONS = ("cache_dir", "cache_max_mb", "cxx", "debug_dir", "torch_compile_debug_dir", "poison")


class CopiedTensor:
    """A weight stored in the package (`weights="copy"`), bound when no model is given."""

    __slots__ = ("store", "target", "tensor")

    def __init__(self, target: str, tensor: torch.Tensor, is_buffer: bool) -> None:
        self.target, self.tensor = target, tensor
        self.store = "_buffers" if is_buffer else "_parameters"  # as LiveTensor's: saving again reads it

    def get(self) -> torch.Tensor:
        return self.tensor


def _not_saved(where: str, saved: Sequence[str], text: str, why: str) -> PackageError:
    listed = "; ".join(saved) or "none"
    return PackageError(f"{where} holds compiled plans for the signature(s) {listed}; this call is {text}, "
                        f"which was not saved, and {why}")  # fmt: skip


class SavedTorchSource(TorchSource):
    """A torch model's source in a loaded package: the saved signatures are its plans; a new one is
    captured from `model` when there is one."""

    def __init__(
        self, model: Any, name: str, mode: str, arity: int | None, where: str, saved: list[str]
    ) -> None:
        # TorchSource.__init__ wants a callable; without a model there is nothing to call.
        self.model, self.mode, self.name, self.input_names, self.arity = model, mode, name, [], arity
        self.where, self.saved = where, saved

    @property
    def eager(self) -> Any:
        return self.model

    def capture(self, inputs: Sequence[torch.Tensor] | None, signature: Hashable) -> Captured:
        if self.model is None:
            why = "no model was given to compile it: autofusion.load(path, model=...)"
            raise _not_saved(self.where, self.saved, self.signature_text(signature), why)
        return super().capture(inputs, signature)

    def caution(self) -> str | None:
        return None if self.model is None else super().caution()


class SavedOnnxSource:
    """An ONNX model's source in a loaded package; with the model given, new signatures convert from it."""

    def __init__(self, model: Any, name: str, input_names: list[str], where: str, saved: list[str]) -> None:
        self.inner: Source | None = None
        if model is not None:
            from autofusion.frontend.onnx.source import OnnxSource  # imports onnx: only with a model

            self.inner = OnnxSource(model)
        self.model = None if self.inner is None else self.inner.model
        self.name, self.input_names, self.where, self.saved = name, input_names, where, saved

    @property
    def eager(self) -> Any:
        return None

    def inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if self.inner is not None:
            return self.inner.inputs(args)
        if len(args) != len(self.input_names):
            raise InputMismatchError(f"{self.name} takes {len(self.input_names)} input(s) "
                                     f"({', '.join(self.input_names)}), got {len(args)}")  # fmt: skip
        tensors = [as_tensor(x, i) for i, x in enumerate(args)]
        return [t if t.is_contiguous() else t.contiguous() for t in tensors]

    def keyed(self, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        # Inputs read at call time (shapes, axes given as inputs) are keyed by value too once the
        # model's conversion says so; a package holds the signatures as they were saved.
        return self.inner.keyed(inputs) if self.inner is not None else ()

    def signature(self, inputs: Sequence[torch.Tensor]) -> Hashable:
        if self.inner is not None:
            return self.inner.signature(inputs)
        return tuple((tuple(t.shape), t.dtype) for t in inputs)

    def signature_text(self, signature: Hashable) -> str:
        assert isinstance(signature, tuple)
        if self.inner is not None:
            return self.inner.signature_text(signature)
        return ", ".join(f"{str(d).removeprefix('torch.')}{list(s)}" for s, d, *_ in signature)

    def capture(self, inputs: Sequence[torch.Tensor] | None, signature: Hashable) -> Captured:
        if self.inner is None:
            why = "no ONNX model was given to convert it: autofusion.load(path, model=...)"
            raise _not_saved(self.where, self.saved, self.signature_text(signature), why)
        return self.inner.capture(inputs, signature)

    def initial_signature(self) -> Hashable | None:
        return None  # the saved signatures are there already

    def eager_reason(self, inputs: Sequence[torch.Tensor]) -> str | None:
        return None

    def accepted(self, inputs: Sequence[torch.Tensor]) -> None:
        return None

    def caution(self) -> str | None:
        return None

    def not_compiled(self) -> str:
        return f"{self.where} holds no compiled signature"


def _options(saved: Options, overrides: dict[str, Any]) -> Options:
    """The package's options, with what describes this machine (LOCAL_OPTIONS) from here."""
    here = Options.from_env(**overrides)
    local = {name: getattr(here, name) for name in LOCAL_OPTIONS}
    local.update({k: v for k, v in overrides.items() if k not in LOCAL_OPTIONS})
    return replace(saved, **local)


def _compiler_runs(cxx: str) -> bool:
    try:
        compiler_version(cxx)
    except BuildError:
        return False
    return True


def _route_chooser(table: dict[Any, str] | None) -> Any:
    if table is None:
        return None

    def choose(m: int, k: int, n: int, dtype: torch.dtype) -> str:
        return table.get((m, k, n, dtype), "plain")

    return choose


def _program(record: dict[str, Any], dll: Any, options: Options, where: str, inputs: warm.Sources,
             weights_copied: bool) -> Program:  # fmt: skip
    route = _route_chooser(record["routes"])
    kind, plan, splan = record["kind"], record["plan"], record["super_plan"]
    stats = {**record["stats"], "package": where}
    why_not = _super_unavailable(splan) if kind == "super" else None
    if why_not is not None:
        # The library holds every kernel of the plan besides the entries: kernel by kernel runs them,
        # and the convolutions take the route's fallback (library.conv_bn_act).
        log.warning("autofusion.load: %s runs kernel by kernel, not as SuperKernels: %s", where, why_not)
        kind, splan = "plan", None
        stats["super_kernel"] = {"on": False, "why": why_not}
    inner: PlanExecutor | SuperExecutor
    if kind == "super":
        inner = SuperExecutor(splan, dll, record["entries"], poison=options.poison, linear_route=route)
    else:
        inner = PlanExecutor(plan, dll if kind == "plan" else None, record["params"], poison=options.poison,
                             linear_route=route)  # fmt: skip
    split = record["split"]
    executor = inner if split is None else FoldedExecutor(split, inner)
    warm.apply(executor, plan, inputs, record.get("warm"), weights_copied)  # absent before it was saved
    return Program(plan, executor, record["source"], stats, dll, record["params"], (), splan)


def _super_unavailable(splan: SuperPlan) -> str | None:
    """None when the saved SuperKernel entries can run here, else why not: entries that call oneDNN
    convolutions need the dnnl glue (carried by the package, but it may not open here: oneDNN missing)."""
    if dnnl_handles(splan) and (why := dnnl_route.status()) is not None:
        return f"its entries call oneDNN convolutions and the dnnl glue is unavailable here ({why})"
    return None


def load(path: str | os.PathLike[str], model: Any = None, **options: Any) -> Any:
    """A `CompiledModel` from the package at `path` (`autofusion.save`). `model`: the module whose
    parameters and buffers a `weights="reference"` package binds by name (needed then), or the ONNX model;
    with it, signatures that were not saved compile here (a C++ compiler is needed for fused kernels).
    `options` override the package's (machine-local ones, like the cache directory, come from here)."""
    where = str(path)
    try:
        z = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise PackageError(f"cannot read the package {where}: {e}") from e
    with z:
        try:
            manifest = json.loads(z.read(mf.MANIFEST))
        except (KeyError, ValueError) as e:
            raise PackageError(f"{where} is not an autofusion package: {e}") from e
        why = mf.refusal(manifest, where)
        if why is not None:
            return _rebuild_or_refuse(why, where, model, options)
        kind = manifest["source"]["kind"]
        if kind == "torch" and model is not None and not isinstance(model, torch.nn.Module) \
                and manifest["live_weights"]:  # fmt: skip
            raise PackageError(f"{where}: model must be the nn.Module the package was saved from, "
                               f"got {type(model).__name__}")  # fmt: skip
        if kind == "onnx" and model is not None and not is_onnx_source(model):
            raise PackageError(f"{where} holds an ONNX model; model= must be an ONNX model (a path, a "
                               f"ModelProto or its bytes), got {type(model).__name__}")  # fmt: skip
        _import_extern_modules(manifest, where)
        tensors, copied = _tensors(path, z, manifest, where)
        live = _live_binder(z, manifest, model, where, copied)
        copied_bound = model is None and manifest["weights"] == "copy"  # weights bound from the package
        body = pickling.load(z.read(mf.PLAN), tensors, live)
        opts = _options(body["options"], options)
        cache = cache_for(opts)
        dlls: dict[str, Any] = {}
        glue = manifest.get("dnnl_glue")  # absent before packages carried it
        for key, lib in manifest["libraries"].items():
            prefix = f"{mf.LIBS}/{key}/"
            files = {n[len(prefix) :]: z.read(n) for n in z.namelist() if n.startswith(prefix)}
            try:
                built = install(cache, key, files)
                if glue is not None and key == glue["key"]:
                    inst = dnnl_conv.Install(Path(glue["include"]), Path(glue["lib"]), glue["onednn"])
                    dnnl_route.adopt(built, inst)  # unusable here: logged, the route falls back
                else:
                    dlls[key] = open_library(built)
            except BuildError as e:
                raise PackageError(f"{where}: cannot open its library {lib['file']}: {e}") from e
    saved = list(manifest["signatures"])
    if kind == "torch":
        source: Any = SavedTorchSource(
            model, manifest["source"]["name"], body["mode"], body["arity"], where, saved
        )
    else:
        names = body["signatures"][0][1]["captured"].conversion.input_names
        source = SavedOnnxSource(model, manifest["source"]["name"], list(names), where, saved)
    cm = CompiledModel(source.model, opts, source=source, settled=True)
    cm.contract = body["contract"]
    entries = body["signatures"]
    order = list(range(len(entries)))
    if body["last"] is not None:  # the last used one last: it is `.last` and the most recently used
        order.remove(body["last"])
        order.append(body["last"])
    for k in order:
        sig, record = entries[k]
        prog = record["program"]
        program = None
        if prog is not None:
            inputs = warm.bound_inputs(record["captured"].sources)
            program = _program(prog, dlls.get(prog["library"]), opts, where, inputs, copied_bound)
        cm.adopt(sig, CompiledGraph(record["captured"], replace(opts, fusion=program is not None), program))
    return cm


def _import_extern_modules(manifest: dict[str, Any], where: str) -> None:
    """Import the modules that register the Python extern targets the saved graphs call (an ONNX
    composite's module, say): without the model nothing else would import them. Only those modules:
    a plan of torch operators imports none of the frontend."""
    for name in manifest.get("extern_modules", []):  # absent in packages saved before it was written
        if not isinstance(name, str) or not name.startswith("autofusion."):
            raise PackageError(f"{where} names {name!r} as an extern module; only autofusion's are loaded")
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise PackageError(f"{where}: its graphs call functions of {name}, which does not import "
                               f"here: {e}") from e  # fmt: skip


def _tensors(
    path: str | os.PathLike[str], z: zipfile.ZipFile, manifest: dict[str, Any], where: str
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor] | None]:
    """(the plan's tensors, the copied weights or None when the package reads them from the model's):
    mapped from `tensors.bin` (format 2), or `torch.load`ed (format 1)."""
    if manifest["format_version"] == 1:
        tensors = torch.load(io.BytesIO(z.read(mf.TENSORS)), weights_only=True)
        copied = None
        if manifest["weights"] == "copy" and mf.WEIGHTS in z.namelist():
            copied = torch.load(io.BytesIO(z.read(mf.WEIGHTS)), weights_only=True)
        return tensors, copied
    try:
        tensors, weights = tensorfile.read(path, z)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise PackageError(f"{where}: cannot read its tensors: {e}") from e
    return tensors, (weights if manifest["weights"] == "copy" else None)


def _live_binder(
    z: zipfile.ZipFile, manifest: dict[str, Any], model: Any, where: str,
    copied: dict[str, torch.Tensor] | None,
) -> Any:  # fmt: skip
    """What stands for each model weight the plan reads: the model's own (checked against what was
    saved), or the package's copy."""
    info: dict[str, dict[str, Any]] = manifest["live_weights"]
    copies: dict[str, torch.Tensor] | None = None
    if model is None and info:
        if manifest["weights"] != "copy":
            why = "pass the model whose weights it reads, load(path, model=m), or save with weights='copy'"
            raise PackageError(f"{where} was saved with weights='reference': {why}")
        copies = copied if copied is not None else {}
    elif model is not None:
        for target, want in info.items():
            try:
                t = operator.attrgetter(target)(model)
            except AttributeError:
                raise PackageError(f"{where} reads the weight {target}, which the model has not") from None
            got = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            if (
                not isinstance(t, torch.Tensor)
                or got["shape"] != want["shape"]
                or got["dtype"] != want["dtype"]
            ):
                raise PackageError(f"{where} reads {target} as {want['dtype']}{want['shape']}; the model's "
                                   f"is {got['dtype']}{got['shape']}")  # fmt: skip

    def live(target: str, is_buffer: bool) -> Any:
        if copies is not None:
            return CopiedTensor(target, copies[target], is_buffer)
        return LiveTensor(model, target, is_buffer)

    return live


def _rebuild_or_refuse(why: str, where: str, model: Any, options: dict[str, Any]) -> Any:
    opts = Options.from_env(**options)
    if model is not None and _compiler_runs(opts.cxx):
        log.warning("autofusion: %s; compiling the model here instead (signatures compile on first use)", why)
        return CompiledModel(model, opts)
    hint = "pass the model (autofusion.load(path, model=m)) on a machine with a C++ compiler to compile it " \
           "here, or save the package again on a machine like this one"  # fmt: skip
    raise PackageError(f"{why}. Refused: {hint}")
