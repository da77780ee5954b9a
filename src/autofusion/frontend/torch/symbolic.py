"""torch models with dims declared dynamic: captured once with symbolic sizes, instantiated per size.

The direct API's `dynamic=` names dims that may change (`signatures.ShapeContract`). With those, the
model is exported once with a `torch.export.Dim` per name (sizes 2 and up: torch specialises 0 and
1) and converted with its sizes as `ir.symbolic.SymInt`s (`symbols.py`), every comparison the
conversion made on them recorded as a guard. That capture is the `TorchTemplate`; a call with other
sizes binds the names and, where every guard holds, is the template's graph with its sizes
substituted (no export, no conversion). The plan of the template's graph is then reused for it
(`autofusion.reuse`).

What captures a size for itself (correct, as before, only slower): a named dim of size 0 or 1, dims
of one name given different sizes, a failing guard, an input that is not contiguous (the template
takes contiguous inputs), and a template that failed: export refusing the Dims (the model
specialises a dim), a size expression the IR cannot hold, or the first instantiation for other sizes
disagreeing with a real capture of those sizes (a size fixed to the hint that no guard saw): equal
printed graphs, or, where tracing took other paths at other sizes (a mask built with vmap), the same
results for the call's inputs from the reference interpreter - else the template is off for the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion.frontend.source import Captured
from autofusion.ir.interpret import run_graph
from autofusion.ir.symbolic import Guards, SymInt, evaluate_expr, guard_text, substitute


class NotSymbolic(Exception):
    """The template does not apply to these sizes (the reason is the message)."""


@dataclass
class TorchTemplate:
    captured: Captured  # its graph's sizes are SymInts holding the hints
    guards: Guards  # comparisons the conversion made on them
    hints: dict[str, int]
    dtypes: tuple[torch.dtype, ...] = ()  # the inputs' dtypes the template was captured with
    trusted: bool = False  # an instantiation for other sizes matched a real capture
    instantiated: int = 0

    def bind(self, inputs: Sequence[torch.Tensor]) -> dict[str, int]:
        """The names' sizes in a call (NotSymbolic when the template does not apply to its inputs)."""
        for i, (t, dtype) in enumerate(zip(inputs, self.dtypes, strict=True)):
            if t.dtype != dtype:
                raise NotSymbolic(f"input {i} is {t.dtype}, the template's {dtype}")
        shapes = [tuple(t.shape) for t in inputs]
        graph = self.captured.conversion.graph
        env: dict[str, int] = {}
        checks: list[tuple[Any, int]] = []
        for (kind, i), gi in zip(self.captured.sources, graph.inputs, strict=True):
            if kind != "user":
                continue
            shape, want = shapes[i], gi.value.type.shape
            if len(shape) != len(want):
                raise NotSymbolic(f"input {i} has rank {len(shape)}, the template {len(want)}")
            for w, n in zip(want, shape, strict=True):
                if isinstance(w, SymInt) and w.expr[0] == "s":
                    if env.setdefault(w.expr[1], int(n)) != int(n):
                        raise NotSymbolic(f"dims named {w.expr[1]!r} have sizes {env[w.expr[1]]} and {n}")
                else:
                    checks.append((w, int(n)))
        for name, n in env.items():
            if n < 2:
                raise NotSymbolic(f"{name} = {n}: sizes 0 and 1 are captured for themselves")
        for w, n in checks:
            value = evaluate_expr(w.expr, env) if isinstance(w, SymInt) else int(w)
            if value != n:
                raise NotSymbolic(f"an input dim of the template is {value} for these sizes, the call's {n}")
        failing = self.guards.failing(env)
        if failing is not None:
            raise NotSymbolic(f"the guard {guard_text(failing)} (for {self.hints}) fails")
        return env

    def instantiate(self, env: dict[str, int]) -> Captured:
        self.instantiated += 1
        conv = self.captured.conversion
        graph = substitute(conv.graph, env)
        return dataclasses.replace(self.captured, conversion=dataclasses.replace(conv, graph=graph))


def make_template(capture: Callable[..., Captured], dims: dict[int, dict[int, str]],
                  inputs: Sequence[torch.Tensor]) -> TorchTemplate:  # fmt: skip
    """`capture(dims=dims)` with its comparisons recorded (NotSymbolic when a named dim is below 2)."""
    hints: dict[str, int] = {}
    for i, per in dims.items():
        for d, name in per.items():
            n = int(inputs[i].shape[d])
            if hints.setdefault(name, n) != n:
                raise NotSymbolic(f"dims named {name!r} have sizes {hints[name]} and {n}")
    if any(n < 2 for n in hints.values()):
        raise NotSymbolic("a size of 0 or 1 (sizes 0 and 1 are captured for themselves)")
    guards = Guards()
    with guards.recording():
        captured = capture(dims=dims)
    # The names the capture kept as sizes (a capture whose dims are optional fixes what the model ties
    # to a weight, and names dims export found equal by the first of them).
    kept = {d.expr[1] for gi in captured.conversion.graph.inputs for d in gi.value.type.shape
            if isinstance(d, SymInt) and d.expr[0] == "s"}  # fmt: skip
    hints = {name: n for name, n in hints.items() if name in kept}
    return TorchTemplate(captured, guards, hints, tuple(t.dtype for t in inputs))


def different_results(a: Captured, b: Captured, inputs: Sequence[torch.Tensor]) -> str | None:
    """Where two captures of one call (an instantiation and a real capture whose graphs differ in
    their nodes: tracing took other paths at other sizes, as a mask built by vmap does) give different
    results for the call's `inputs` (run by the reference interpreter); None: the same."""
    ga, gb = a.conversion.graph, b.conversion.graph
    if [gi.value.type for gi in ga.inputs] != [gi.value.type for gi in gb.inputs]:
        return "their inputs differ"
    xa = [inputs[v] if kind == "user" else v for kind, v in a.bindings]
    xb = [inputs[v] if kind == "user" else v for kind, v in b.bindings]
    try:
        with torch.no_grad():
            ra, rb = run_graph(ga, xa), run_graph(gb, xb)
    except Exception as e:  # noqa: BLE001 - a graph that cannot run here is not shown equal
        return f"running them failed: {e}"
    for k, (x, y) in enumerate(zip(ra, rb, strict=True)):
        same = x.shape == y.shape and x.dtype == y.dtype and torch.allclose(
            x.double(), y.double(), rtol=1e-5, atol=1e-6, equal_nan=True)  # fmt: skip
        if not same:
            return f"output {k} differs"
    return None


def trust_check(template: TorchTemplate, captured: Captured, real: Captured,
                inputs: Sequence[torch.Tensor]) -> tuple[str | None, bool]:  # fmt: skip
    """Compare an instantiation of `template` (`captured`) with a real capture of the same call: (why the
    template must be off, or None; whether the graphs differ in their nodes with the same results). The
    template is trusted when they agree (equal printed graphs, or the same results for `inputs`)."""
    if str(real.conversion.graph) == str(captured.conversion.graph):
        template.trusted = True
        return None, False
    why = different_results(captured, real, inputs)
    if why is not None:
        return why, False
    template.trusted = True
    return None, True


@dataclass
class SymbolicTorch:
    """What a `TorchSource` keeps of its symbolic capture (stats["torch_symbolic"])."""

    template: TorchTemplate | None = None
    off: str | None = None  # why the template is not used (None: it is, or not made yet)
    captures: int = 0  # torch.export captures (the template's included)
    for_themselves: dict[str, int] = field(default_factory=dict)  # why a size was captured for itself
    last_env: dict[str, int] | None = None  # the names' sizes of the last capture, when instantiated

    def stats(self) -> dict[str, Any]:
        t = self.template
        return {
            "torch_symbolic": {
                "on": self.off is None and t is not None,
                "why_off": self.off,
                "symbols": {} if t is None else dict(t.hints),
                "guards": 0 if t is None else len(t.guards),
                "trusted": t is not None and t.trusted,
                "captures": self.captures,
                "instantiations": 0 if t is None else t.instantiated,
                "captured_for_themselves": dict(self.for_themselves),
            }
        }
