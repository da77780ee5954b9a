"""A compiled plan ready to run (`Program`) and the disk cache options name (`cache_for`).

In: what the compiler made (`compiler.compile_graph`) or a saved package held (`autofusion.package`).
Out: the object `CompiledGraph` calls. Defined here, below the compiler, so that running a loaded
package imports the runtime and the plan's types only, never the compiler's passes, solver or
code generator.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from autofusion.cache import Cache
from autofusion.config import Options
from autofusion.plan.schedule import Plan
from autofusion.plan.superkernel import SuperPlan
from autofusion.runtime.executor import PlanExecutor
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.super_executor import SuperExecutor

if TYPE_CHECKING:  # ten event dataclasses: a loaded package's Program has no events to make
    from autofusion.events import Event, EventRecord

Executor = PlanExecutor | SuperExecutor | FoldedExecutor


@dataclass(frozen=True)
class Program:
    """A compiled signature: its plan, its executor and what was recorded making them."""

    plan: Plan  # with freezing, of the graph after the fold split (its inputs end with the folded values)
    executor: Executor  # called with the captured graph's inputs
    source: str = ""
    stats: dict[str, Any] = field(default_factory=dict)  # complete when the Program is made; not changed
    library: Any = None  # the loaded ctypes library (None: no kernels, or the build failed)
    params: dict[str, list[int]] = field(default_factory=dict)  # each kernel's size/stride array
    records: tuple[EventRecord, ...] = ()  # typed events (autofusion.events), in pipeline order
    super_plan: SuperPlan | None = None

    def plan_inputs(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The inputs of `plan.graph` for the captured graph's `inputs`: with freezing, the folded
        values follow them (tools that run the plan's steps themselves need those)."""
        ex = self.executor
        return [*inputs, *ex.folded(inputs)] if isinstance(ex, FoldedExecutor) else list(inputs)

    @property
    def events(self) -> list[Event]:
        """The events as JSON dicts (the public form: `CompiledModel.events`, `events.jsonl`)."""
        return [r.to_dict() for r in self.records]


@functools.cache
def _private_dir() -> str:
    # Options(cache_dir="") asks for no persistent cache: kernels are still built somewhere, so in a
    # directory of this process's own, removed when it exits (not in the caller's working directory).
    path = tempfile.mkdtemp(prefix="autofusion-")
    atexit.register(shutil.rmtree, path, True)
    return path


def cache_for(options: Options) -> Cache:
    """The disk cache the options name, with their size cap; a private one when they name none."""
    return Cache(options.cache_dir or _private_dir(), max_bytes=options.cache_max_mb << 20)
