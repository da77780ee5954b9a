"""Fusion bisection: find the rule, pass or merge that breaks the tolerance (or makes the model slower).

In: a model, example inputs, compile options and a criterion. Out: a `BisectResult` naming the
culprit merge with its numbers (the decision event: sides, rule, bytes and µs saved, budget), the
error or time just before and with it, and a disable list that was checked to repair the model.

Axis: the solver's accepted merges in solver order. The solver is deterministic and
`Options.max_merges = k` accepts exactly the first k merges of the unlimited run (later candidates
are refused with NF2101), so "the model with the first k merges" is well defined for 0 <= k <= N.
The search assumes k = 0 is good and k = N is bad (both are measured first; if k = 0 is already bad
the fault is not a fusion and the result says so) and finds the smallest bad k in about log2(N)
compiles. The capture runs once; each trial compiles the captured graph again (the disk cache makes
repeated prefixes cheap).

Criteria: `rtol` - the model's output against its reference (`compare.relative_error` against
`compare.baseline`: eager PyTorch, or onnxruntime for an ONNX model) exceeds rtol;
`slower` - the best time of `repeat` runs with k merges exceeds the one with none by more than
`margin`.

Repair: the culprit's nodes (the smaller side first) are tried one at a time as a disable list
(Options.disable_fusion, NF2100) with every other merge on; the first that passes is returned as
verified.

Rules and passes come first. Their axis is the switches that changed this model, in a stable order:
the fusion rules that fired (plan.stats["rules"], by name), then the graph passes that rewrote the
graph (plan.stats["passes"], manager.PASS_NAMES order), then `horizontal_kernel` when a horizontal
merge was accepted. With the full model bad, the model with all of them off (Options.disabled, every
merge allowed) is measured; when that is good, a binary search finds the smallest k such that turning
off the first k repairs the model, and switch k is the culprit (then checked alone: `disable_verified`).
When turning them all off does not repair the model, the merges are searched as above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion.config import Options
from autofusion.events import Event
from autofusion.tools.diagnose.compare import baseline, best_ms, is_onnx_model, relative_error

Progress = Callable[[str], None]


@dataclass
class Trial:
    merges: int
    value: float  # relative error, or median ms
    bad: bool


@dataclass
class SwitchTrial:
    off: list[str]  # the rules and passes turned off
    value: float
    bad: bool


@dataclass
class BisectResult:
    mode: str
    threshold: float
    total_merges: int
    trials: list[Trial] = field(default_factory=list)
    kind: str = "merge"  # what the culprit is: "merge", "rule" or "pass"
    switches: list[str] = field(default_factory=list)  # the rules and passes that changed the model
    switch_trials: list[SwitchTrial] = field(default_factory=list)
    switch: str | None = None  # the culprit rule or pass (kind "rule" or "pass")
    switches_off: list[str] = field(default_factory=list)  # rules/passes off while the merges were searched
    culprit: Event | None = None  # the accepted merge's decision event
    index: int | None = None  # 1-based position of the culprit among the accepted merges
    before: float | None = None  # value with index - 1 merges
    after: float | None = None  # value with index merges
    kernel: str | None = None  # the kernel the culprit merge produced (in the prefix run)
    disable: list[str] = field(default_factory=list)  # node names (kind "merge") or the rule/pass name
    disable_verified: bool = False
    disable_value: float | None = None
    message: str = ""

    @property
    def found(self) -> bool:
        return self.culprit is not None or self.switch is not None


def first_bad(n: int, is_bad: Callable[[int], bool]) -> int:
    """Smallest k in 1..n with is_bad(k), given is_bad(0) is False and is_bad(n) is True."""
    lo, hi = 0, n  # invariant: lo good, hi bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if is_bad(mid):
            hi = mid
        else:
            lo = mid
    return hi


class _Session:
    """One capture, many compiles: the model with the first k merges, optionally a disable list."""

    def __init__(
        self,
        model: Any,
        inputs: Sequence[torch.Tensor],
        options: dict[str, Any],
        mode: str,
        threshold: float,
        repeat: int,
        progress: Progress | None,
    ) -> None:
        from autofusion.api import _model_name
        from autofusion.frontend.torch.capture import capture

        self.model, self.inputs, self.options = model, list(inputs), dict(options)
        self.mode, self.threshold, self.repeat = mode, threshold, repeat
        self.progress = progress or (lambda msg: None)
        base = Options.from_env(**self.options)
        if is_onnx_model(model):
            self.captured, self.reference = _onnx_capture(model, self.inputs)
        else:
            with torch.no_grad():
                self.captured = capture(model, self.inputs, base.capture, _model_name(model))
                model(*self.inputs)  # eager's first call can differ from later ones
                self.reference = model(*self.inputs)
        self._baseline_ms: float | None = None

    def compiled(self, merges: int, disable: Sequence[str] = (), off: Sequence[str] = ()) -> Any:
        from autofusion.api import CompiledGraph

        opts = dict(self.options)
        opts["max_merges"] = merges
        opts["disable_fusion"] = tuple(opts.get("disable_fusion", ())) + tuple(disable)
        if off:
            opts["disabled"] = frozenset(opts.get("disabled") or Options.from_env().disabled) | set(off)
        return CompiledGraph(self.captured, Options.from_env(**opts))

    def value(self, merges: int, disable: Sequence[str] = (), off: Sequence[str] = ()) -> float:
        cg = self.compiled(merges, disable, off)
        if self.mode == "rtol":
            with torch.no_grad():
                return relative_error(cg.run(self.inputs), self.reference)
        return best_ms(lambda *xs: cg.run(xs), self.inputs, self.repeat)

    def is_bad(self, value: float) -> bool:
        if self.mode == "rtol":
            return not value <= self.threshold  # NaN counts as bad
        assert self._baseline_ms is not None
        return value > self._baseline_ms * (1 + self.threshold)

    def trial(self, result: BisectResult, merges: int) -> Trial:
        v = self.value(merges)
        if self.mode == "slower" and merges == 0:
            self._baseline_ms = v
        t = Trial(merges, v, self.is_bad(v))
        result.trials.append(t)
        unit = "ms" if self.mode == "slower" else "rel. error"
        self.progress(f"{merges:4d} merges: {unit} {v:.3g} -> {'bad' if t.bad else 'good'}")
        return t

    def switch_trial(self, result: BisectResult, off: list[str]) -> SwitchTrial:
        v = self.value(-1, off=off)
        t = SwitchTrial(list(off), v, self.is_bad(v))
        result.switch_trials.append(t)
        unit = "ms" if self.mode == "slower" else "rel. error"
        what = ", ".join(off) if len(off) <= 3 else f"{len(off)} rules/passes"
        self.progress(f"off {what}: {unit} {v:.3g} -> {'bad' if t.bad else 'good'}")
        return t


def _onnx_capture(source: Any, inputs: list[torch.Tensor]) -> tuple[Any, Any]:
    """An ONNX model's graph for these input shapes, and the reference output (`compare.baseline`:
    onnxruntime when it runs the model, else the reference runtime on the converted graph)."""
    from autofusion.frontend.onnx.source import OnnxSource

    # Inputs that give shapes are bound to their values in `inputs`, as a compiled model does.
    captured = OnnxSource(source).capture_inputs(inputs)
    with torch.no_grad():
        return captured, baseline(source, captured.conversion.graph).run(*inputs)


def accepted_merges(events: list[Event]) -> list[Event]:
    return [e for e in events if e["event"] == "fusion.candidate" and e["accepted"]]


def changed_switches(cg: Any) -> list[tuple[str, str]]:
    """(kind, name) of each rule and pass that changed the compiled model, in the stable order the
    module docstring gives."""
    if cg.program is None:
        return []
    stats = cg.program.plan.stats
    out = [("rule", name) for name in sorted(stats.get("rules", {}))]
    out += [("pass", name) for name in stats.get("passes", [])]
    if any(e.get("kind") == "horizontal" for e in accepted_merges(cg.program.events)):
        out.append(("pass", "horizontal_kernel"))
    return out


def _bisect_switches(
    s: _Session, result: BisectResult, switches: list[tuple[str, str]], full_value: float
) -> bool:
    """Search the rules and passes (the full model is bad, `full_value`). True when one of them is the
    culprit; then `before` is the value with it (and the ones ahead of it) off, `after` with it on."""
    names = [name for _, name in switches]
    result.switches = names
    if not names or s.switch_trial(result, names).bad:
        return False
    values = {0: full_value, len(names): result.switch_trials[-1].value}

    def repaired(k: int) -> bool:  # first k switched off: good?
        t = s.switch_trial(result, names[:k])
        values[k] = t.value
        return not t.bad

    k = first_bad(len(names), repaired)  # smallest k whose first k off repair the model
    result.kind, result.switch = switches[k - 1][0], names[k - 1]
    if k - 1 not in values:  # first_bad probed k - 1 unless it is 0
        values[k - 1] = s.switch_trial(result, names[: k - 1]).value
    result.before, result.after = values[k], values[k - 1]
    result.message = f"{result.kind} {result.switch} is the first bad one ({k} of {len(names)} in order)"
    # Checked alone (for k = 1 that is the trial with the first k off, already measured).
    alone = values[1] if k == 1 else s.switch_trial(result, [names[k - 1]]).value
    result.disable, result.disable_value = [names[k - 1]], alone
    result.disable_verified = not s.is_bad(alone)
    return True


def bisect_fusion(
    model: Any,
    inputs: Sequence[torch.Tensor],
    *,
    mode: str = "rtol",
    threshold: float = 1e-5,
    options: dict[str, Any] | None = None,
    repeat: int = 20,
    repair: bool = True,
    progress: Progress | None = None,
    search_switches: bool = True,
) -> BisectResult:
    if mode not in ("rtol", "slower"):
        raise ValueError(f"mode must be 'rtol' or 'slower', got {mode!r}")
    options = dict(options or {})
    s = _Session(model, inputs, options, mode, threshold, repeat, progress)
    full = s.compiled(-1)
    merges = accepted_merges(full.program.events if full.program is not None else [])
    result = BisectResult(mode, threshold, len(merges))
    base = s.trial(result, 0)  # first: --slower measures against it
    top = s.trial(result, len(merges)) if merges else base
    # A wrong rule or pass shows with or without merges, so the switches are searched before the
    # "no merge is already bad" verdict.
    switches = changed_switches(full) if search_switches else []
    if top.bad and _bisect_switches(s, result, switches, top.value):
        return result
    if base.bad and switches:
        # Bad with no merge, and turning the rules and passes off does not repair it: a rule or pass and
        # a merge may both be at fault. Search the merges with the rules and passes off (a new capture:
        # another merge list); `bisect_all` then turns the merge off and comes back for the rule.
        names = [name for _, name in switches]
        s.progress(f"searching the merges with {', '.join(names)} off")
        off = frozenset(options.get("disabled") or Options.from_env().disabled) | set(names)
        inner = bisect_fusion(
            model, inputs, mode=mode, threshold=threshold, options={**options, "disabled": off},
            repeat=repeat, repair=repair, progress=progress, search_switches=False,
        )  # fmt: skip
        inner.switches, inner.switches_off = names, names
        inner.switch_trials = result.switch_trials + inner.switch_trials
        inner.message += f" (with the rules and passes {', '.join(names)} off)"
        return inner
    if base.bad:
        result.message = (
            "the model is already over tolerance with no merge at all, and turning off the rules and "
            "passes that fired does not repair it: the fault is not a fusion (run `autofusion check` "
            "on it, or compare with fusion=False)"
        )
        return result
    if not merges:
        result.message = "the solver accepts no merge for this model: nothing to bisect"
        return result
    if not top.bad:
        what = "within tolerance" if mode == "rtol" else "not slower than with no merge"
        result.message = f"with all {len(merges)} merges the model is {what}: nothing to find"
        return result
    values = {t.merges: t.value for t in result.trials}

    def probe(k: int) -> bool:
        t = s.trial(result, k)
        values[k] = t.value
        return t.bad

    k = first_bad(len(merges), probe)
    if k - 1 not in values:
        values[k - 1] = s.trial(result, k - 1).value
    result.index, result.culprit = k, merges[k - 1]
    result.before, result.after = values[k - 1], values[k]
    result.kernel = _kernel_of(s.compiled(k), result.culprit)
    result.message = f"merge {k} of {len(merges)} is the first bad one"
    if repair:
        _repair(s, result)
    return result


def _kernel_of(cg: Any, merge: Event) -> str | None:
    if cg.program is None:
        return None
    want = {merge["first_nodes"][0], merge["second_nodes"][0]}
    for step in cg.program.plan.kernels:
        if want <= {n.name for n in step.kernel.nodes}:
            return str(step.name)
    return None


def _repair(s: _Session, result: BisectResult, max_tries: int = 6) -> None:
    """The first single node of the culprit (smaller side first) whose disabling fixes the model. When
    none does (another merge is also at fault), the one that helps most, unverified: `bisect_all`
    then searches again with it disabled."""
    assert result.culprit is not None
    sides = sorted((result.culprit["first_nodes"], result.culprit["second_nodes"]), key=len)
    names = list(dict.fromkeys(n for side in sides for n in side))
    candidates: list[list[str]] = [[n] for n in names[:max_tries]]
    if len(sides[0]) > 1:
        candidates.append(list(sides[0]))
    best: tuple[float, list[str]] | None = None
    for cand in candidates:
        v = s.value(-1, cand)
        s.progress(f"disable {', '.join(cand)}: {v:.3g} -> {'bad' if s.is_bad(v) else 'good'}")
        if not s.is_bad(v):
            result.disable, result.disable_verified, result.disable_value = cand, True, v
            return
        if best is None or v < best[0]:
            best = (v, cand)
    if best is not None:
        result.disable_value, result.disable = best


def bisect_all(model: Any, inputs: Sequence[torch.Tensor], *, max_culprits: int = 8,
               options: dict[str, Any] | None = None, **kw: Any) -> list[BisectResult]:  # fmt: skip
    """Bisect, disable the culprit, bisect again, until the model passes (or `max_culprits`): for
    models with more than one bad rule, pass or merge. Each result's `disable` adds to the list the next
    one uses (Options.disabled for a rule or pass, Options.disable_fusion for nodes)."""
    options = dict(options or {})
    results: list[BisectResult] = []
    for _ in range(max_culprits):
        r = bisect_fusion(model, inputs, options=options, **kw)
        results.append(r)
        # A merge found with rules/passes off was checked with them off: the real model needs another round.
        if not r.found or not r.disable or (r.disable_verified and not r.switches_off):
            break
        if r.kind == "merge":
            options["disable_fusion"] = tuple(options.get("disable_fusion", ())) + tuple(r.disable)
        else:
            options["disabled"] = frozenset(options.get("disabled") or Options.from_env().disabled) | set(
                r.disable
            )
    return results
