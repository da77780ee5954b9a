"""ONNX Attention (opsets 23-25) and RotaryEmbedding as IR decompositions that fuse with their neighbours.

Attention is spelled as the spec's reference does it: Q and K each scaled by sqrt(scale), one batched
matmul, softcap, the additive bias (attn_mask, causal frontier, sliding window, nonpad_kv_seqlen
padding: built from arange and compares, so it fuses into the bias add), softmax, a guard that zeroes
fully masked rows, and a batched matmul with V. Grouped-query attention needs no repeat of K and V:
the query heads that share a KV head are stacked as rows of one matmul.
"""

from __future__ import annotations

import math

import numpy as np

from autofusion.frontend.onnx.context import OnnxCtx, dtype_of, onnx_op, unsupported
from autofusion.frontend.onnx.converters.activations import along
from autofusion.frontend.onnx.converters.norms import softmax
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType

_NEG_INF = -math.inf


def _to_4d(ctx: OnnxCtx, t: TV, heads: int, what: str) -> TV:
    """[b, s, heads * d] -> [b, heads, s, d]."""
    b, s, hidden = t.shape
    if heads <= 0 or hidden % heads:
        raise unsupported(f"{what} hidden size {hidden} is not a multiple of {heads} heads")
    return ctx.permute(ctx.reshape(t, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def _literal(value: float, dtype: DType) -> float:
    """`value` rounded to `dtype` first, as the reference casts its scale to the input type."""
    if dtype is DType.float16:
        return float(np.float16(value))
    if dtype is DType.float32:
        return float(np.float32(value))
    return value


def _allowed(
    ctx: OnnxCtx,
    q: int,
    kv: int,
    offset: int | TV,
    causal: bool,
    left: int,
    right: int,
) -> TV | None:
    """Which keys each query may see under the causal frontier and the sliding window: bool [q, kv], or
    [b, 1, q, kv] when `offset` is a per-batch tensor (nonpad_kv_seqlen - q). None when nothing masks."""
    if not causal and left < 0 and right < 0:
        return None
    per_batch = isinstance(offset, TV)
    rank = 3 if per_batch else 2
    i = along(ctx, q, rank - 2, rank)
    j = along(ctx, kv, rank - 1, rank)
    if isinstance(offset, TV):
        pos = ctx.add("add", (i, ctx.reshape(offset, (offset.shape[0], 1, 1))))
    else:
        pos = ctx.add("add", (i, ctx.scalar(offset, DType.int64))) if offset else i
    conds: list[TV] = []
    if causal:
        conds.append(ctx.add("le", (j, pos)))
    diff = ctx.add("sub", (pos, j)) if left >= 0 or right >= 0 else None
    if diff is not None and left >= 0:
        conds.append(ctx.add("le", (diff, ctx.scalar(left, DType.int64))))
    if diff is not None and right >= 0:
        conds.append(ctx.add("ge", (diff, ctx.scalar(-right, DType.int64))))
    ok = conds[0]
    for c in conds[1:]:
        ok = ctx.add("logical_and", (ok, c))
    if per_batch:
        ok = ctx.reshape(ok, (ok.shape[0], 1, q, kv))
    return ok


def _static_rows_masked(q: int, kv: int, offset: int, causal: bool, left: int, right: int) -> bool:
    """Whether some query row sees no key under a frontier known at import."""
    i = np.arange(q).reshape(q, 1) + offset
    j = np.arange(kv).reshape(1, kv)
    ok = np.ones((q, kv), dtype=bool)
    if causal:
        ok &= j <= i
    if left >= 0:
        ok &= i - j <= left
    if right >= 0:
        ok &= j - i <= right
    return bool((~ok).all(axis=-1).any())


def _additive(ctx: OnnxCtx, ok: TV, dtype: DType) -> TV:
    """A bool mask as a bias: 0 where allowed, -inf where not."""
    return ctx.add("where", (ok, ctx.scalar(0, dtype), ctx.scalar(_NEG_INF, dtype)))


@onnx_op("Attention")
def _attention(ctx: OnnxCtx) -> tuple[TV, TV | None, TV | None, TV | None]:
    q, k, v = ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)
    dt = q.dtype
    if not dt.is_float or k.dtype is not dt or v.dtype is not dt:
        raise unsupported(f"Attention of {q.dtype.short}/{k.dtype.short}/{v.dtype.short}")
    rank = q.rank
    if rank == 3:
        qh, kvh = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        if qh is None or kvh is None:
            raise unsupported("3-d Attention inputs without q_num_heads and kv_num_heads")
        q, k, v = _to_4d(ctx, q, int(qh), "Q"), _to_4d(ctx, k, int(kvh), "K"), _to_4d(ctx, v, int(kvh), "V")
    elif rank != 4 or k.rank != 4 or v.rank != 4:
        raise unsupported(f"Attention of ranks {q.rank}, {k.rank}, {v.rank}")
    b, hq, sq, d = q.shape
    hk = k.shape[1]
    if v.shape[1] != hk or hq % hk:
        raise unsupported(f"Attention with {hq} query heads and {hk}/{v.shape[1]} key/value heads")

    past_k = ctx.tensor(4) if ctx.has(4) else None
    past_v = ctx.tensor(5) if ctx.has(5) else None
    nonpad = ctx.tensor(6) if ctx.has(6) else None
    if (past_k is None) != (past_v is None):
        raise unsupported("past_key without past_value (or the reverse)")
    if nonpad is not None and past_k is not None:
        raise unsupported("nonpad_kv_seqlen together with a past cache")
    past = 0
    if past_k is not None and past_v is not None:
        past = past_k.shape[2]
        k = ctx.add("concat", (past_k, k), {"dim": 2}) if past else k
        v = ctx.add("concat", (past_v, v), {"dim": 2}) if past else v
    present_k, present_v = k, v
    kv = k.shape[2]

    scale = ctx.attr("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    # The query heads sharing KV head g are rows of one matmul: [b*hk, (hq/hk)*sq, d] @ [b*hk, d, kv].
    # Views of the inputs come first, so that what is computed feeds the matmul without a reshape.
    rep = hq // hk
    q3 = ctx.reshape(q, (b * hk, rep * sq, d))
    k3 = ctx.reshape(ctx.permute(k, (0, 1, 3, 2)), (b * hk, d, kv))
    if dt.is_half:
        # Q and K each scaled by sqrt(scale), rounded to the half type, as the reference does: the
        # product's rounding then matches it bit for bit
        root = ctx.scalar(_literal(math.sqrt(scale), dt), dt)
        qk = ctx.add("bmm", (ctx.add("mul", (q3, root)), ctx.add("mul", (k3, root))))
    else:
        # one scale of the product, which joins the softmax's kernel (the two forms differ by an ulp)
        qk = ctx.add("mul", (ctx.add("bmm", (q3, k3)), ctx.scalar(scale, dt)))
    qk = ctx.reshape(qk, (b, hq, sq, kv))
    raw = qk
    softcap = float(ctx.attr("softcap", 0.0))
    if softcap > 0:
        cap = ctx.scalar(softcap, dt)
        qk = ctx.add("mul", (ctx.add("tanh", (ctx.add("div", (qk, cap)),)), cap))

    # The additive bias and whether a row can be fully masked (then its probabilities are zeroed).
    causal = bool(int(ctx.attr("is_causal", 0)))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    if left < -1 or right < -1:
        raise unsupported(f"window sizes {left}, {right}")
    bias: TV | None = None
    may_mask_rows = False
    if ctx.has(3):
        m = ctx.tensor(3)
        bias = _additive(ctx, m, dt) if m.dtype.is_bool else ctx.cast(m, dt)
        if bias.shape[-1] < kv:
            # a mask shorter than the keys leaves the rest masked out
            bias = ctx.add("pad", (bias,), {"pads": (0, kv - bias.shape[-1]), "value": _NEG_INF})
        may_mask_rows = True
    offset: int | TV = past
    if nonpad is not None:
        if nonpad.shape != (b,):
            raise unsupported(f"nonpad_kv_seqlen of shape {nonpad.shape}")
        nonpad = ctx.cast(nonpad, DType.int64)
        offset = ctx.add("sub", (nonpad, ctx.scalar(sq, DType.int64)))
        may_mask_rows = True
    elif causal or left >= 0 or right >= 0:
        may_mask_rows |= _static_rows_masked(sq, kv, past, causal, left, right)
    ok = _allowed(ctx, sq, kv, offset, causal, left, right)
    if ok is not None:
        frontier = _additive(ctx, ok, dt)
        bias = frontier if bias is None else ctx.add("add", (bias, frontier))
    if nonpad is not None:
        keys = along(ctx, kv, 1, 2)
        padded = ctx.add("lt", (keys, ctx.reshape(nonpad, (b, 1))))
        pad_bias = ctx.reshape(_additive(ctx, padded, dt), (b, 1, 1, kv))
        bias = pad_bias if bias is None else ctx.add("add", (bias, pad_bias))

    logits = qk if bias is None else ctx.add("add", (qk, bias))
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise unsupported(f"qk_matmul_output_mode={mode}")
    # Mode 0 is the raw product, as the spec and onnxruntime have it (onnx's reference evaluator gives
    # the softcapped scores there, as for mode 1; no backend case reads mode 0 with a softcap).
    qk_out: TV = {0: raw, 1: qk}.get(mode, logits)

    if ctx.has_attr("softmax_precision"):
        sp = dtype_of(int(ctx.attr("softmax_precision")), f"softmax_precision of node {ctx.name!r}")
        if not sp.is_float:
            raise unsupported(f"softmax_precision {sp.short}")
        logits = ctx.cast(logits, sp)
    probs = softmax(ctx, logits, 3)
    if may_mask_rows and bias is not None:
        top = ctx.add("amax", (bias,), {"dims": (bias.rank - 1,), "keepdim": True})
        dead = ctx.add("eq", (top, ctx.scalar(_NEG_INF, dt)))
        probs = ctx.add("where", (dead, ctx.scalar(0, probs.dtype), probs))
    probs = ctx.cast(probs, dt)
    if mode == 3:
        qk_out = probs

    dv = v.shape[3]
    if probs.shape != (b, hq, sq, kv):
        raise unsupported(f"attn_mask of shape {ctx.type(3).shape} for scores [{b}, {hq}, {sq}, {kv}]")
    p3 = ctx.reshape(probs, (b * hk, rep * sq, kv))
    y = ctx.reshape(ctx.add("bmm", (p3, ctx.reshape(v, (b * hk, kv, dv)))), (b, hq, sq, dv))
    if rank == 3:
        y = ctx.reshape(ctx.permute(y, (0, 2, 1, 3)), (b, sq, hq * dv))

    outs = ctx.node.output
    read = [len(outs) > i and bool(outs[i]) for i in range(4)]
    return (
        y,
        present_k if read[1] else None,
        present_v if read[2] else None,
        ctx.cast(qk_out, dt) if read[3] else None,
    )


@onnx_op("RotaryEmbedding")
def _rotary(ctx: OnnxCtx) -> TV:
    x, cos, sin = ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)
    if not x.dtype.is_float:
        raise unsupported(f"RotaryEmbedding of {x.dtype.short}")
    shape = x.shape
    if x.rank == 4:
        x = ctx.permute(x, (0, 2, 1, 3))  # [b, s, heads, d]
    elif x.rank == 3:
        heads = int(ctx.attr("num_heads", 0))
        if heads <= 0 or shape[2] % heads:
            raise unsupported(f"3-d RotaryEmbedding input {shape} with num_heads={heads}")
        x = ctx.reshape(x, (shape[0], shape[1], heads, shape[2] // heads))
    else:
        raise unsupported(f"RotaryEmbedding of rank {x.rank}")
    b, s, _, d = x.shape
    rd = int(ctx.attr("rotary_embedding_dim", 0)) or d
    half = rd // 2
    if rd % 2 or rd > d:
        raise unsupported(f"rotary_embedding_dim={rd} for head size {d}")
    if ctx.has(3):
        # caches [max_pos, rd/2] read at position_ids [b, s]
        ids = ctx.tensor(3)
        if ids.shape != (b, s) or cos.rank != 2 or sin.rank != 2:
            raise unsupported(f"position_ids of shape {ids.shape} with caches {cos.shape}, {sin.shape}")
        pos = ctx.reshape(ctx.cast(ids, DType.int64), (b * s,))
        cos, sin = (
            ctx.reshape(ctx.add("index_select", (c, pos), {"dim": 0}), (b, s, c.shape[-1]))
            for c in (cos, sin)
        )
    if cos.shape != (b, s, half) or sin.shape != (b, s, half):
        raise unsupported(f"cos/sin caches {cos.shape}/{sin.shape} for [{b}, {s}, {half}]")
    cos, sin = (ctx.reshape(ctx.cast(c, x.dtype), (b, s, 1, half)) for c in (cos, sin))
    rot = x if rd == d else ctx.add("slice", (x,), {"dim": 3, "start": 0, "end": rd, "step": 1})
    if int(ctx.attr("interleaved", 0)):
        x1 = ctx.add("slice", (rot,), {"dim": 3, "start": 0, "end": rd, "step": 2})
        x2 = ctx.add("slice", (rot,), {"dim": 3, "start": 1, "end": rd, "step": 2})
    else:
        x1 = ctx.add("slice", (rot,), {"dim": 3, "start": 0, "end": half, "step": 1})
        x2 = ctx.add("slice", (rot,), {"dim": 3, "start": half, "end": rd, "step": 1})
    real = ctx.add("sub", (ctx.add("mul", (cos, x1)), ctx.add("mul", (sin, x2))))
    imag = ctx.add("add", (ctx.add("mul", (sin, x1)), ctx.add("mul", (cos, x2))))
    if int(ctx.attr("interleaved", 0)):
        # (real, imag) pairs side by side again: [..., half, 2] -> [..., rd]
        pairs = ctx.add(
            "concat", (ctx.reshape(real, (*real.shape, 1)), ctx.reshape(imag, (*imag.shape, 1))), {"dim": 4}
        )
        rotated = ctx.reshape(pairs, (*real.shape[:3], rd))
    else:
        rotated = ctx.add("concat", (real, imag), {"dim": 3})
    if rd < d:
        rest = ctx.add("slice", (x,), {"dim": 3, "start": rd, "end": d, "step": 1})
        rotated = ctx.add("concat", (rotated, rest), {"dim": 3})
    if len(shape) == 4:
        return ctx.permute(rotated, (0, 2, 1, 3))
    return ctx.reshape(rotated, shape)


@onnx_op("CausalConvWithState")
def _causal_conv(ctx: OnnxCtx) -> tuple[TV, TV | None]:
    # depthwise conv1d over [past_state (or zeros), input]; present_state is the last k-1 columns
    x, w = ctx.tensor(0), ctx.tensor(1)
    if x.rank != 3 or w.rank != 3 or w.shape[0] != x.shape[1] or w.shape[1] != 1 or not x.dtype.is_float:
        raise unsupported(f"CausalConvWithState of input {x} and weight {w}")
    act = ctx.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise unsupported(f"activation {act!r}")
    b, c, n = x.shape
    k = w.shape[2]
    bias = ctx.tensor(2) if ctx.has(2) else None
    if ctx.has(3):
        past = ctx.cast(ctx.tensor(3), x.dtype)
        if past.shape != (b, c, k - 1):
            raise unsupported(f"past_state of shape {past.shape} for kernel size {k}")
    else:
        past = ctx.add("full", (), {"value": 0.0, "dtype": x.dtype, "shape": (b, c, k - 1)})
    padded = ctx.add("concat", (past, x), {"dim": 2}) if k > 1 else x
    attrs = {
        "stride": (1,),
        "padding": (0,),
        "dilation": (1,),
        "transposed": False,
        "output_padding": (0,),
        "groups": c,
        "has_bias": bias is not None,
    }
    ins = (padded, ctx.cast(w, x.dtype)) + ((ctx.cast(bias, x.dtype),) if bias is not None else ())
    y = ctx.add("conv", ins, attrs)
    if act != "none":
        y = ctx.add("silu", (y,))
    read = len(ctx.node.output) > 1 and bool(ctx.node.output[1])
    if not read:
        return y, None
    total = n + k - 1
    state = ctx.add("slice", (padded,), {"dim": 2, "start": total - (k - 1), "end": total, "step": 1})
    return y, state


# LinearAttention's recurrence is unrolled, one set of fused ops per token; longer sequences would make
# graphs of tens of thousands of nodes, so they are refused (a chunked closed form would take them).
MAX_LINEAR_ATTENTION_STEPS = 256


@onnx_op("LinearAttention")
def _linear_attention(ctx: OnnxCtx) -> tuple[TV, TV]:
    q, k, v = ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)
    rule = ctx.attr("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise unsupported(f"update_rule {rule!r}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != ctx.has(4) or delta != ctx.has(5):
        raise unsupported(f"update_rule {rule!r} with decay given: {ctx.has(4)}, beta given: {ctx.has(5)}")
    if q.rank != 3 or k.rank != 3 or v.rank != 3 or not q.dtype.is_float:
        raise unsupported(f"LinearAttention of {q}, {k}, {v}")
    hq, hk = int(ctx.attr("q_num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
    if hq <= 0 or hk <= 0 or hq % hk:
        raise unsupported(f"q_num_heads={hq}, kv_num_heads={hk}")
    b, steps, _ = q.shape
    if steps > MAX_LINEAR_ATTENTION_STEPS:
        raise unsupported(
            f"{steps} tokens; the unrolled recurrence takes at most {MAX_LINEAR_ATTENTION_STEPS}"
        )
    f32 = DType.float32
    q4, k4, v4 = (
        ctx.cast(_to_4d(ctx, t, h, n), f32)
        for t, h, n in ((q, hq, "query"), (k, hk, "key"), (v, hk, "value"))
    )
    dk, dv, group = q4.shape[3], v4.shape[3], hq // hk
    if k4.shape[3] != dk:
        raise unsupported(f"query head size {dk} != key head size {k4.shape[3]}")
    decay = beta = None
    if gating:
        g = ctx.tensor(4)
        if g.rank != 3 or g.shape[2] not in (hk, hk * dk):
            raise unsupported(f"decay of shape {g.shape}")
        decay = ctx.cast(_to_4d(ctx, g, hk, "decay"), f32)  # [b, hk, T, 1 or dk]
    if delta:
        bt = ctx.tensor(5)
        if bt.rank != 3 or bt.shape[2] not in (hk, 1):
            raise unsupported(f"beta of shape {bt.shape}")
        beta = ctx.cast(_to_4d(ctx, bt, bt.shape[2], "beta"), f32)  # [b, hk or 1, T, 1]
    state_dtype = q.dtype
    if ctx.has(3):
        past = ctx.tensor(3)
        if past.shape != (b, hk, dk, dv):
            raise unsupported(f"past_state of shape {past.shape}, not {(b, hk, dk, dv)}")
        state_dtype = past.dtype
        state = ctx.cast(past, f32)
    else:
        state = ctx.add("full", (), {"value": 0.0, "dtype": f32, "shape": (b, hk, dk, dv)})
    scale = float(ctx.attr("scale", 0.0)) or 1.0 / math.sqrt(dk)

    def at(t: TV, i: int) -> TV:
        return ctx.add("select", (t,), {"dim": 2, "index": i})

    outs = []
    for i in range(steps):
        k_t, v_t = at(k4, i), at(v4, i)  # [b, hk, dk], [b, hk, dv]
        k_col = ctx.reshape(k_t, (b, hk, dk, 1))
        if decay is not None:
            g_t = ctx.add("exp", (at(decay, i),))
            state = ctx.add("mul", (state, ctx.reshape(g_t, (*g_t.shape, 1))))
        if beta is not None:
            seen = ctx.add("sum", (ctx.add("mul", (state, k_col)),), {"dims": (2,), "keepdim": False})
            v_t = ctx.add("mul", (at(beta, i), ctx.add("sub", (v_t, seen))))
        state = ctx.add("add", (state, ctx.add("mul", (k_col, ctx.reshape(v_t, (b, hk, 1, dv))))))
        q_t = ctx.reshape(at(q4, i), (b, hk, group, dk, 1))
        read = ctx.add("mul", (q_t, ctx.reshape(state, (b, hk, 1, dk, dv))))
        o_t = ctx.add("sum", (read,), {"dims": (3,), "keepdim": False})  # [b, hk, group, dv]
        outs.append(ctx.reshape(ctx.add("mul", (o_t, ctx.scalar(scale, f32))), (b, 1, hq * dv)))
    y = outs[0] if len(outs) == 1 else ctx.add("concat", outs, {"dim": 1})
    return ctx.cast(y, q.dtype), ctx.cast(state, state_dtype)
