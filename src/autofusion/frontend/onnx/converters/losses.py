"""ONNX losses -> IR: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both take scores or log-probabilities of shape (N, C, d1..dk) and integer targets of shape (N, d1..dk).
The picked log-probability is an IR `gather` along the class dim (torch's gather checks the index
bounds at run time, as onnxruntime does); the per-element weight is `weight[target]`, an
`index_select`. Targets equal to `ignore_index` (any int, negative or past C) are first replaced by
class 0 so the gather stays in range, then their loss and weight are selected to 0 (a select, not a
multiply: -inf * 0 would be NaN). Reductions: none, sum, and mean = sum(loss) / sum(weights of the
targets not ignored), which is the plain mean when there are neither weights nor ignored targets.
"""

from __future__ import annotations

from autofusion.frontend.onnx.context import OnnxCtx, onnx_op, unsupported
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType

_REDUCTIONS = ("none", "sum", "mean")


def nll_loss(ctx: OnnxCtx, logp: TV, target: TV, weight: TV | None) -> TV:
    """The NLL of `logp` (N, C, ...) at `target` (N, ...), reduced as the node's attributes say."""
    reduction = ctx.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise unsupported(f"reduction {reduction!r}")
    if logp.rank < 2 or target.shape != (logp.shape[0], *logp.shape[2:]):
        raise unsupported(f"input {logp.type} with target {target.type}")
    if not logp.dtype.is_float:
        raise unsupported(f"loss of {logp.dtype.short}")
    fdt = logp.dtype
    idx = ctx.cast(target, DType.int64)
    ignored: TV | None = None
    if ctx.has_attr("ignore_index"):
        ignored = ctx.add("eq", (idx, ctx.scalar(int(ctx.attr("ignore_index")), DType.int64)))
        idx = ctx.add("where", (ignored, ctx.scalar(0, DType.int64), idx))
    n, rest = logp.shape[0], logp.shape[2:]
    picked = ctx.add("gather", (logp, ctx.reshape(idx, (n, 1, *rest))), {"dim": 1})
    loss = ctx.add("neg", (ctx.reshape(picked, idx.shape),))
    w: TV | None = None
    if weight is not None:
        flat = ctx.reshape(idx, (idx.type.numel,))
        w = ctx.reshape(ctx.add("index_select", (weight, flat), {"dim": 0}), idx.shape)
        loss = ctx.add("mul", (loss, w))
    if ignored is not None:
        zero = ctx.scalar(0, fdt)
        loss = ctx.add("where", (ignored, zero, loss))
        w = ctx.add("where", (ignored, zero, ctx.scalar(1, fdt) if w is None else w))
    if reduction == "none":
        return loss
    total = ctx.add("sum", (loss,), {"dims": (), "keepdim": False})
    if reduction == "sum":
        return total
    if w is None:
        return ctx.add("mean", (loss,), {"dims": (), "keepdim": False})
    return ctx.add("div", (total, ctx.add("sum", (w,), {"dims": (), "keepdim": False})))


def _weight(ctx: OnnxCtx) -> TV | None:
    return ctx.tensor(2) if ctx.has(2) else None


@onnx_op("NegativeLogLikelihoodLoss")
def _nll(ctx: OnnxCtx) -> TV:
    return nll_loss(ctx, ctx.tensor(0), ctx.tensor(1), _weight(ctx))


@onnx_op("SoftmaxCrossEntropyLoss")
def _sce(ctx: OnnxCtx) -> tuple[TV, TV | None]:
    scores = ctx.tensor(0)
    if scores.rank < 2 or not scores.dtype.is_float:
        raise unsupported(f"scores {scores.type}")
    logp = ctx.add("log_softmax", (scores,), {"dim": 1})
    loss = nll_loss(ctx, logp, ctx.tensor(1), _weight(ctx))
    wants_logp = len(ctx.node.output) > 1 and bool(ctx.node.output[1])
    return loss, logp if wants_logp else None
