"""Tuning spread over a Ray cluster: the same search (`search.Tuner`), its evaluations run on other nodes.

Which nodes: only those of this machine's fingerprint (CPU model, cores, ISA flags, versions), since
a record is only valid for the machine it was measured on. Each such node offers one unit of a custom
Ray resource named after the fingerprint (`machine_resource()`; start a node with
`ray start --address=HEAD --resources='{"<name>": 1}'`, the name `autofusion tune --ray-label` prints).
One evaluator actor per unit holds the model and its compiled candidates; every actor takes the whole
unit, so a node runs one measurement at a time and measurements never disturb each other.

A local cluster (`--ray auto` when no cluster is running) is started with the unit on this machine.
Ray is an optional dependency (the `distributed` extra); nothing here imports it until it is used.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from autofusion.hw.measure import available_cores
from autofusion.tools.tune.search import Evaluation, Job, Mapper, Problem, evaluate
from autofusion.tuning import machine_fingerprint

log = logging.getLogger("autofusion.tune")

RESOURCE_PREFIX = "autofusion_machine_"


def machine_resource() -> str:
    """The Ray resource this machine's fingerprint offers (see the module docstring)."""
    return RESOURCE_PREFIX + hashlib.sha256(machine_fingerprint().encode()).hexdigest()[:16]


class RayUnavailable(RuntimeError):
    pass


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            "tuning on Ray needs the ray package: pip install 'autofusion[distributed]'"
        ) from None
    return ray


def connect(address: str) -> int:
    """Join the cluster at `address` ("auto": a running one, else a local one started here) and return
    how many measurement units of this machine's fingerprint it offers."""
    ray, name = _ray(), machine_resource()
    if not ray.is_initialized():
        if address == "auto":
            try:
                ray.init(address="auto", log_to_driver=False)
            except ConnectionError:
                log.info("no running Ray cluster: starting a local one with %s=1", name)
                ray.init(num_cpus=available_cores(), resources={name: 1}, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    units = int(ray.cluster_resources().get(name, 0))
    if units < 1:
        raise RayUnavailable(
            f"no node of this cluster offers {name} (nodes of this machine's fingerprint: "
            f"{machine_fingerprint()}); start them with: "
            f"ray start --address=<head> --resources='{{\"{name}\": 1}}'"
        )
    return units


class _Evaluator:
    """Lives on one node (as a Ray actor): builds the problem there once, then evaluates jobs."""

    def __init__(self, model: Any, inputs: Sequence[Any], base: dict[str, Any] | None, rounds: int,
                 rtol: float | None = None) -> None:  # fmt: skip
        import torch

        torch.set_num_threads(available_cores())
        self.problem = Problem(model, inputs, base, rounds, rtol)

    def fingerprint(self) -> str:
        return machine_fingerprint()

    def evaluate(self, job: Job) -> Evaluation:
        return evaluate(self.problem, job)


def ray_mapper(problem: Problem, units: int) -> Mapper:
    """Evaluate each pass's jobs on the cluster's actors, as they come free; results in job order."""
    ray, name = _ray(), machine_resource()
    # The actor's OpenMP pool is set from the environment before it starts: as many threads as cores,
    # the same as a local run (Ray would otherwise limit an actor of one CPU to one thread).
    threads = {"OMP_NUM_THREADS": str(available_cores())}
    actor = ray.remote(num_cpus=0, resources={name: 1}, runtime_env={"env_vars": threads})(_Evaluator)
    model_ref, inputs_ref = ray.put(problem.model), ray.put(problem.inputs)
    base, rounds = problem.base_overrides, problem.rounds
    actors = [actor.remote(model_ref, inputs_ref, base, rounds, problem.tolerance) for _ in range(units)]
    here = machine_fingerprint()
    for fp in ray.get([a.fingerprint.remote() for a in actors]):
        if fp != here:  # a node started with the label but not of this machine: its timings are not ours
            raise RayUnavailable(f"a node offering {name} is another machine ({fp}); this one is {here}")
    pool = ray.util.ActorPool(actors)

    def run(jobs: list[Job]) -> Iterator[Evaluation]:
        yield from pool.map(lambda a, job: a.evaluate.remote(job), jobs)

    return run
