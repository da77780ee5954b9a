"""One `extern` node (an ATen call) inside a converter's IR, for ops lowered to IR around one library call.

The node is the one `fallback.py` makes for a whole ONNX node (target, argument template with `Arg(i)`
marking tensor input i, the output type), but built by a converter: a CumSum's scan between the
flips and shifts that are IR, a Det between casts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autofusion.frontend.onnx.context import OnnxCtx
from autofusion.frontend.torch.context import TV
from autofusion.ir.types import TensorType


def extern_call(
    ctx: OnnxCtx,
    target: str,
    inputs: Sequence[TV],
    args: tuple[Any, ...],
    out_type: TensorType,
    reason: str,
    kwargs: dict[str, Any] | None = None,
) -> TV:
    """One `extern` node inside a converter's IR: `target` called with `args` (Arg(i) = inputs[i])."""
    (vid,) = ctx.b.add_node(
        "extern",
        [t.id for t in inputs],
        {
            "target": target,
            "args": args,
            "kwargs": tuple(sorted((kwargs or {}).items())),
            "out_types": (out_type,),
            "reason": reason,
        },
        name=ctx.name,
        loc=ctx.loc,
    )
    return TV(vid, ctx.b.type_of(vid))
