"""The `torch.compile(model, backend="autofusion")` entry (registered as a torch_dynamo_backends entry point).

In: the FX graph Dynamo captured and its example inputs. Out: a callable Dynamo installs in place of
the graph. Dynamo's graph is re-exported to functional ATen (non-strict: Dynamo already did the
capture), converted to IR and run by our runtime. What we cannot take (autograd, symbolic shapes, a
failed capture) runs Dynamo's graph eagerly, with the reason logged once (Dynamo calls the backend
once per graph).

The callable returned always says what it is: `autofusion_graph` (the `CompiledGraph`, or None when
it runs eagerly) and `autofusion_stats()` (the graph's stats, or {"eager_fallback": reason}).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofusion.api import CompiledGraph
from autofusion.config import Options
from autofusion.errors import FrontendError
from autofusion.frontend.source import Captured
from autofusion.frontend.torch.capture import capture
from autofusion.ir.graph import InputRole
from autofusion.passes.rewrite import settle_options

log = logging.getLogger(__name__)


def eager_reason(example_inputs: Sequence[Any]) -> str | None:
    """Why this graph must run eagerly, or None when we can compile it."""
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            return f"input {i} is a {type(t).__name__} (dynamic shapes are not supported; use dynamic=False)"
        if any(not isinstance(s, int) for s in t.shape):
            return f"input {i} has a symbolic shape {tuple(t.shape)} (use torch.compile(..., dynamic=False))"
        if t.device.type != "cpu":
            return f"input {i} is on {t.device}; the autofusion backend runs on the CPU"
    if torch.is_grad_enabled() and any(t.requires_grad for t in example_inputs):
        return ("the graph needs autograd (grad mode is on and an input or parameter requires grad); "
                "autofusion compiles inference graphs: run under torch.no_grad() or "
                "torch.inference_mode()")  # fmt: skip
    return None


def _module_state(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> set[int]:
    """Positions of the inputs that are the module's parameters and buffers: Dynamo passes them as graph
    inputs (its placeholder's source names the module attribute it read)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out: set[int] = set()
    for i, (node, t) in enumerate(zip(placeholders, example_inputs, strict=False)):
        arg = node.meta.get("grapharg")
        source = getattr(getattr(arg, "source", None), "name", "")
        name = source() if callable(source) else str(source)
        if isinstance(t, torch.nn.Parameter) or "._parameters[" in name or "._buffers[" in name:
            out.add(i)
    return out


def mark_parameters(captured: Captured, positions: set[int]) -> Captured:
    """`captured` with the graph inputs bound to the caller's tensors at `positions` marked as parameters
    (PARAM/BUFFER roles), so freezing folds what is computed from them. They are still read from the
    call's arguments every time; the fold's version guard sees a replaced or changed one."""
    graph = captured.conversion.graph
    inputs = list(graph.inputs)
    changed = False
    for pos, (kind, v) in enumerate(captured.sources):
        if kind == "user" and v in positions and inputs[pos].role is InputRole.USER:
            inputs[pos] = dataclasses.replace(inputs[pos], role=InputRole.PARAM)
            changed = True
    if not changed:
        return captured
    conversion = dataclasses.replace(captured.conversion, graph=graph.replace(inputs=tuple(inputs)))
    return dataclasses.replace(captured, conversion=conversion)


def autofusion_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
) -> Callable[..., Any]:
    options = settle_options(Options.from_env(**(kwargs.get("options") or {})))
    reason = eager_reason(example_inputs)
    if reason is None:
        try:
            captured = capture(gm, list(example_inputs), "non-strict", "forward")
            compiled = CompiledGraph(mark_parameters(captured, _module_state(gm, example_inputs)), options)
        except FrontendError as e:
            reason = str(e)
    if reason is not None:
        log.warning("autofusion backend: running this graph eagerly: %s", reason)
        forward = gm.forward

        def eager(*args: Any) -> Any:
            return forward(*args)

        # Attributes on a function, read by tests and reports (mypy types no attributes on functions).
        eager.autofusion_graph = None  # type: ignore[attr-defined]
        eager.autofusion_stats = lambda: {"eager_fallback": reason}  # type: ignore[attr-defined]
        return eager

    # Dynamo calls what we return directly: hand it the compiled graph's own call (no wrapper of
    # ours between Dynamo's guards and the executor).
    run = compiled.call
    run.autofusion_graph = compiled  # type: ignore[attr-defined]  # for tests and reports, as above
    run.autofusion_stats = compiled.stats  # type: ignore[attr-defined]
    return run
