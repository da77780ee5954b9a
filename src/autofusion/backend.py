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

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofusion.api import CompiledGraph
from autofusion.config import Options
from autofusion.errors import FrontendError
from autofusion.frontend.torch.capture import capture
from autofusion.frontend.torch.mutation import SharedInputMemory
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


def _shared_memory_eager(call: Callable[..., Any], forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        try:
            return call(*args)
        except SharedInputMemory as e:
            log.warning("autofusion backend: running this call eagerly: %s", e)
            return forward(*args)

    return run


def autofusion_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
) -> Callable[..., Any]:
    options = settle_options(Options.from_env(**(kwargs.get("options") or {})))
    reason = eager_reason(example_inputs)
    if reason is None:
        try:
            compiled = CompiledGraph(capture(gm, list(example_inputs), "non-strict", "forward"), options)
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
    # ours between Dynamo's guards and the executor), unless the graph updates its inputs: a call
    # whose updated input shares memory with another runs Dynamo's graph instead.
    run = (
        compiled.call if not compiled.captured.mutations else _shared_memory_eager(compiled.call, gm.forward)
    )
    run.autofusion_graph = compiled  # type: ignore[attr-defined]  # for tests and reports, as above
    run.autofusion_stats = compiled.stats  # type: ignore[attr-defined]
    return run
