"""How well the cost model predicts this machine: the second half of `autofusion calibrate`.

In: benchmark cases (built-in models, tools/models/builtins.py, and kernels like those of
benchmarks/bench_fusion.py) and the profile the planner uses. Out:
- kernel points: for every generated kernel of each case's plan (GEMM-epilogue kernels aside: the
  estimate does not model their GEMM), and of the sampled candidates below, the estimated time
  (fusion/cost.estimate) and the measured one (tools/calibrate/bench.py). `spearman` of the two is the
  model's rank correlation.
- verdicts: merge candidates sampled from each case's graph. The solver runs with every legal merge
  accepted (min_benefit_s = -inf), so its decisions walk through the candidates the planner meets,
  profitable or not; for an evenly spaced sample of them, the two sides and the merged group are lowered
  as the solver lowers them and timed: the measured verdict is "fuse" when the merged kernel is faster
  than the two, and the model's when `merge_benefit(...).net > 0`. A candidate whose two timings are
  within `TIE` of each other is a tie: it counts for agreement whatever the verdicts, and is reported.
Kernels read the values a reference run of the plan's graph gives their inputs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from autofusion.cache import Cache
from autofusion.codegen.cpp.render import supports
from autofusion.fusion.cost import estimate, merge_benefit
from autofusion.fusion.solver import FusionLimits, Solver
from autofusion.hw.profile import HardwareProfile
from autofusion.kernel.lower import LoopKernel, NotExpressible
from autofusion.kernel.tile import choose_tile
from autofusion.plan.schedule import KernelStep, Plan
from autofusion.runtime.buffers import to_layout
from autofusion.tools.calibrate.bench import Item, time_items
from autofusion.tools.diagnose.precision import reference_values

log = logging.getLogger(__name__)

TIE = 0.03  # measured fused and unfused times closer than this (relative) are a tie


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks, ties taking their mean rank.
    NaN when there are fewer than two points or either side is constant."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} x values but {len(ys)} y values")
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(rx)
    if n < 2:
        return math.nan
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., Any]
    inputs: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Point:
    case: str
    kernel: str
    estimated_s: float
    measured_s: float


@dataclass(frozen=True)
class Verdict:
    case: str
    pair: str
    model_fuse: bool
    measured_fuse: bool
    net_s: float  # the model's benefit
    unfused_s: float  # measured: the two kernels
    fused_s: float  # measured: the merged kernel

    @property
    def tie(self) -> bool:
        return abs(self.unfused_s - self.fused_s) <= TIE * max(self.unfused_s, self.fused_s)

    @property
    def agrees(self) -> bool:
        return self.model_fuse == self.measured_fuse or self.tie


def _bench_cases(quick: bool) -> list[Case]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    def chain6(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((x * 1.5 + y).sigmoid() * x - 0.5).relu()

    def chain20(x: torch.Tensor) -> torch.Tensor:
        h = ((x + 1.0) * 2.0).sin().exp() - 0.5
        h = (h.tanh().sigmoid() * 3.0).relu().neg() + x
        return ((h.cos() * x).abs() + 0.25).sqrt().sigmoid().sub(x).tanh() * 0.5

    def gelu_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + b)

    def softmax(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)

    def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def center(x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(-1, keepdim=True)

    def bcast(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.exp() * 2.0).sin()[:, None] + y  # fused, the sine runs once per element of y

    sizes = (64,) if quick else (64, 1024)
    out = [Case(f"ew_chain {n}x1024", chain6, (r(n, 1024), r(n, 1024))) for n in sizes]
    out += [Case(f"softmax {n}x1024", softmax, (r(n, 1024),)) for n in sizes]
    out.append(Case("bcast 256x1024", bcast, (r(256), r(256, 1024))))
    if quick:
        return out
    out += [Case(f"gelu_bias {n}x1024", gelu_bias, (r(n, 1024), r(1024))) for n in sizes]
    out += [Case(f"layer_norm {n}x1024", layer_norm, (r(n, 1024), r(1024), r(1024))) for n in sizes]
    out += [Case(f"center {n}x1024", center, (r(n, 1024),)) for n in sizes]
    out.append(Case("chain20 64", chain20, (r(64),)))
    # near the model's fuse/no-fuse boundary: the broadcast repeats the sine 16, 128 and 4096 times
    out += [Case(f"bcast {m}x{n}", bcast, (r(m), r(m, n))) for m, n in ((4096, 16), (1024, 128), (64, 4096))]
    return out


def benchmark_cases(quick: bool = False, limit: int | None = None) -> list[Case]:
    """bench_fusion-like kernels, then the built-in models (none with --quick); at most `limit`."""
    out = _bench_cases(quick)
    if not quick:
        from autofusion.tools.models.builtins import builtin
        from autofusion.tools.models.names import BUILTIN_NAMES

        for name in BUILTIN_NAMES:
            model, inputs = builtin(name)
            out.append(Case(f"builtin:{name}", model, tuple(inputs)))
    return out[:limit] if limit else out


def _inputs_of(k: LoopKernel, env: dict[int, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    out = []
    for b in k.buffers:
        if b.is_output:
            out.append(torch.empty(b.type.shape, dtype=b.type.dtype.to_torch()))
        else:
            out.append(to_layout(env[b.vid], b.type))
    return tuple(out)


@dataclass
class CaseResult:
    points: list[Point]
    verdicts: list[Verdict]


def measure_case(case: Case, cache: Cache, *, candidates: int, quick: bool,
                 profile: HardwareProfile | None = None) -> CaseResult:  # fmt: skip
    """Kernel points and sampled verdicts of one case (module docstring). The case is planned as
    `compile` plans it; `profile` (default: the plan's) estimates and judges the kernels."""
    from autofusion import api

    with torch.no_grad():
        cm = api.compile(case.fn, list(case.inputs), cache_dir=str(cache.root))
    cg = cm.compiled
    if cg is None or cg.program is None:
        log.info("%s runs eagerly; skipped", case.name)
        return CaseResult([], [])
    program = cg.program
    plan: Plan = program.plan
    profile = profile or plan.profile
    env = reference_values(plan.graph, program.plan_inputs(cg.bind(list(case.inputs))))
    items: list[Item] = []
    labels: list[str] = []
    for step in plan.steps:
        if isinstance(step, KernelStep) and step.gemm is None:
            items.append(Item(step.kernel, step.tile, _inputs_of(step.kernel, env)))
            labels.append(step.name)
    sampled = _candidates(plan, profile, candidates)
    triples: list[tuple[str, LoopKernel, LoopKernel, LoopKernel]] = []
    for i, (pair, ka, kb, kf) in enumerate(sampled):
        named = [_renamed(k, f"cand{i}_{tag}") for k, tag in ((ka, "a"), (kb, "b"), (kf, "f"))]
        triples.append((pair, named[0], named[1], named[2]))
        for k in named:
            items.append(Item(k, choose_tile(k, profile), _inputs_of(k, env)))
            labels.append(k.name)
    times = time_items(items, cache, rounds=4 if quick else 8, total_s=5.0 if quick else 30.0)
    measured = dict(zip(labels, times, strict=True))
    points = [Point(case.name, label, estimate(it.kernel, profile, it.tile).seconds, measured[label])
              for it, label in zip(items, labels, strict=True)]  # fmt: skip
    verdicts = []
    for pair, ka, kb, kf in triples:
        net = merge_benefit(ka, kb, kf, profile).net
        unfused, fused = measured[ka.name] + measured[kb.name], measured[kf.name]
        verdicts.append(Verdict(case.name, pair, net > 0, fused < unfused, net, unfused, fused))
    return CaseResult(points, verdicts)


def _renamed(k: LoopKernel, name: str) -> LoopKernel:
    return replace(k, name=name)


def _candidates(
    plan: Plan, profile: HardwareProfile, count: int
) -> list[tuple[str, LoopKernel, LoopKernel, LoopKernel]]:
    """Up to `count` merge candidates of the plan's graph, evenly spaced over the solver's merges with
    every legal merge accepted: (label, first side, second side, merged)."""
    if count <= 0:
        return []
    limits = FusionLimits(min_benefit_s=-math.inf, gemm_epilogue=False)
    solver = Solver(plan.graph, profile, limits, supports)
    result = solver.solve()
    index = {n.name: k for k, n in enumerate(plan.graph.nodes)}
    merges = [d for d in result.decisions if d.accepted and d.benefit is not None and d.kind != "rule"]
    if len(merges) > count:
        step = len(merges) / count
        merges = [merges[int(i * step)] for i in range(count)]
    out = []
    for d in merges:
        a = sorted(index[n] for n in d.first_nodes)
        b = sorted(index[n] for n in d.second_nodes)
        try:
            ka, kb, kf = solver.lower(a, "a"), solver.lower(b, "b"), solver.lower(sorted(a + b), "f")
        except NotExpressible as e:  # a side that is only a kernel within a larger group
            log.debug("candidate %s + %s not measured: %s", d.first, d.second, e)
            continue
        out.append((f"{d.first} + {d.second}", ka, kb, kf))
    return out
