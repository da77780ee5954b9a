"""ONNX RNN, GRU and LSTM as typed externs: torch ops per time step, in ONNX's gate orders and equations
(ReverseSequence, which reverses within lengths as the reverse direction does, is in externs/misc.py).

ATen's rnn ops are not used: their gate orders differ (torch's LSTM is i f g o, ONNX's i o f c; torch's
GRU r z n, ONNX's z r h), they have no peepholes, clip, linear_before_reset=0 GRU, per-direction
activations or sequence lengths in ONNX's sense. So each step is written out (`_step_*`), the input
projection of all steps done as one matmul first. Every attribute is read: direction (forward, reverse,
bidirectional), hidden_size, activations with activation_alpha / activation_beta, clip, layout,
linear_before_reset (GRU), input_forget (LSTM); every input: B, sequence_lens, initial_h, initial_c, P.

sequence_lens: batch entry b runs its first L_b steps only; Y is 0 after them, Y_h / Y_c hold the state
after step L_b (for the reverse direction, each sequence is reversed within its own length), and the
zero state for L_b = 0 (as onnxruntime gives; the ONNX spec does not say). Half
inputs compute in fp32 and round once at the end.

The functions run on meta tensors too (no data-dependent Python branching), which is how the ONNX
frontend types the extern (`convert._extern_types`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from autofusion.frontend.onnx.context import OnnxCtx, unsupported
from autofusion.frontend.onnx.fallback import ArgFn, fallback
from autofusion.frontend.subgraph import register_target

Act = tuple[str, float, float]  # (name in lower case, alpha, beta)

# name -> (takes alpha, takes beta, f(x, alpha, beta)). Alpha and beta are consumed from
# activation_alpha / activation_beta in the order of the activations that take them, as onnxruntime
# does; an activation that takes one and finds the list exhausted uses its default (0 for those
# without one in _DEFAULTS, as onnxruntime does).
_ACTS: dict[str, tuple[bool, bool, Callable[[torch.Tensor, float, float], torch.Tensor]]] = {
    "relu": (False, False, lambda x, a, b: torch.relu(x)),
    "tanh": (False, False, lambda x, a, b: torch.tanh(x)),
    "sigmoid": (False, False, lambda x, a, b: torch.sigmoid(x)),
    "affine": (True, True, lambda x, a, b: x * a + b),
    "leakyrelu": (True, False, lambda x, a, b: F.leaky_relu(x, a)),
    "thresholdedrelu": (True, False, lambda x, a, b: torch.where(x > a, x, torch.zeros_like(x))),
    "scaledtanh": (True, True, lambda x, a, b: torch.tanh(x * b) * a),
    "hardsigmoid": (True, True, lambda x, a, b: torch.clamp(x * a + b, 0.0, 1.0)),
    "elu": (True, False, lambda x, a, b: torch.where(x > 0, x, torch.expm1(x) * a)),
    "softsign": (False, False, lambda x, a, b: x / (1 + x.abs())),
    "softplus": (False, False, lambda x, a, b: F.softplus(x)),
}
_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ("tanh",), "GRU": ("sigmoid", "tanh"), "LSTM": ("sigmoid", "tanh", "tanh")}


def _apply(act: Act, x: torch.Tensor) -> torch.Tensor:
    return _ACTS[act[0]][2](x, act[1], act[2])


def _activations(ctx: OnnxCtx, n_dirs: int) -> tuple[Act, ...]:
    kind = ctx.node.op_type
    per_dir = len(_DEFAULT_ACTS[kind])
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in ctx.attr("activations", [])]
    if not names:
        names = list(_DEFAULT_ACTS[kind]) * n_dirs
    elif len(names) == per_dir and n_dirs == 2:
        names = names * 2  # one set given for both directions
    if len(names) != per_dir * n_dirs:
        raise unsupported(f"{len(names)} activations for {n_dirs} direction(s) of {per_dir} each")
    alphas = [float(a) for a in ctx.attr("activation_alpha", [])]
    betas = [float(b) for b in ctx.attr("activation_beta", [])]
    out: list[Act] = []
    for name in names:
        key = name.lower()
        if key not in _ACTS:
            raise unsupported(f"activation {name!r}")
        takes_a, takes_b, _ = _ACTS[key]
        da, db = _DEFAULTS.get(key, (0.0, 0.0))
        a = (alphas.pop(0) if alphas else da) if takes_a else 0.0
        b = (betas.pop(0) if betas else db) if takes_b else 0.0
        out.append((key, a, b))
    return tuple(out)


@fallback("RNN", "GRU", "LSTM")
def _recurrent(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    kind = ctx.node.op_type
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise unsupported(f"direction {direction!r}")
    n_dirs = 2 if direction == "bidirectional" else 1
    if not ctx.type(0).dtype.is_float:
        raise unsupported(f"{kind} of {ctx.type(0).dtype.short} values")
    hidden = int(ctx.attr("hidden_size", ctx.type(2).shape[-1]))
    clip = ctx.attr("clip")
    n_in = {"RNN": 6, "GRU": 6, "LSTM": 8}[kind]
    opt = tuple(arg(i) if ctx.has(i) else None for i in range(3, n_in))
    extra = (int(ctx.attr("linear_before_reset", 0)), int(ctx.attr("input_forget", 0)))
    literals = (direction, hidden, _activations(ctx, n_dirs), None if clip is None else float(clip),
                int(ctx.attr("layout", 0)), *extra)  # fmt: skip
    return RECURRENT_TARGET, (kind, arg(0), arg(1), arg(2), opt, literals), {}


def _reverse(x: torch.Tensor, lens: torch.Tensor | None) -> torch.Tensor:
    """x [T, B, ...] with each batch entry's first L_b steps in reverse order (the rest unchanged)."""
    if lens is None:
        return x.flip(0)
    t = torch.arange(x.shape[0], device=x.device).unsqueeze(1)
    ln = lens.to(torch.int64).unsqueeze(0)
    idx = torch.where(t < ln, ln - 1 - t, t)
    return x.gather(0, idx.reshape(*idx.shape, *([1] * (x.dim() - 2))).expand(x.shape))


def _clip(x: torch.Tensor, clip: float | None) -> torch.Tensor:
    return x if clip is None else torch.clamp(x, -clip, clip)


def _direction(
    kind: str, x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, b: torch.Tensor | None, h: torch.Tensor,
    c: torch.Tensor | None, p: torch.Tensor | None, acts: Sequence[Act], clip: float | None,
    lens: torch.Tensor | None, linear_before_reset: int, input_forget: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """One direction over x [T, B, I] from state h (and c) [B, H]: (Y [T, B, H], last h, last c)."""
    n_hidden = r.shape[-1]
    g = _GATES[kind] * n_hidden
    wb, rb = (b[:g], b[g:]) if b is not None else (None, None)
    xw = torch.matmul(x, w.t())  # every step's input projection at once
    if wb is not None:
        xw = xw + wb
    ys: list[torch.Tensor] = []
    for t in range(x.shape[0]):
        hr = torch.matmul(h, r.t())
        if rb is not None and not (kind == "GRU" and linear_before_reset == 0):
            hr = hr + rb
        if kind == "RNN":
            h_new, c_new = _apply(acts[0], _clip(xw[t] + hr, clip)), None
        elif kind == "GRU":
            h_new, c_new = _gru(xw[t], hr, h, r, rb, acts, clip, linear_before_reset), None
        else:
            assert c is not None
            h_new, c_new = _lstm(xw[t] + hr, c, p, acts, clip, input_forget)
        if lens is None:
            h, c, y = h_new, c_new, h_new
        else:
            valid = (lens > t).unsqueeze(1)
            y = torch.where(valid, h_new, torch.zeros_like(h_new))
            h = torch.where(valid, h_new, h)
            if c is not None and c_new is not None:
                c = torch.where(valid, c_new, c)
        ys.append(y)
    y_all = torch.stack(ys) if ys else x.new_zeros((0, x.shape[1], n_hidden))
    if lens is not None:  # a sequence of length 0 ends in the zero state (onnxruntime's reading)
        ran = (lens > 0).unsqueeze(1)
        h = torch.where(ran, h, torch.zeros_like(h))
        c = None if c is None else torch.where(ran, c, torch.zeros_like(c))
    return y_all, h, c


def _gru(
    xw: torch.Tensor, hr: torch.Tensor, h: torch.Tensor, r: torch.Tensor, rb: torch.Tensor | None,
    acts: Sequence[Act], clip: float | None, linear_before_reset: int,
) -> torch.Tensor:  # fmt: skip
    n = h.shape[-1]
    f, g = acts[0], acts[1]
    rb_zr = rb[: 2 * n] if rb is not None and not linear_before_reset else None  # else already in hr
    zr_pre = xw[:, : 2 * n] + hr[:, : 2 * n]
    zr = _apply(f, _clip(zr_pre if rb_zr is None else zr_pre + rb_zr, clip))
    z, rr = zr[:, :n], zr[:, n:]
    if linear_before_reset:
        pre = xw[:, 2 * n :] + rr * hr[:, 2 * n :]  # hr already holds Rbh
    else:
        pre = xw[:, 2 * n :] + torch.matmul(rr * h, r[2 * n :].t())
        if rb is not None:
            pre = pre + rb[2 * n :]
    cand = _apply(g, _clip(pre, clip))
    return (1 - z) * cand + z * h


def _lstm(
    gates: torch.Tensor, c: torch.Tensor, p: torch.Tensor | None, acts: Sequence[Act], clip: float | None,
    input_forget: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    n = c.shape[-1]
    f, g, hact = acts
    pi, po, pf = (p[:n], p[n : 2 * n], p[2 * n :]) if p is not None else (None, None, None)
    i_pre, o_pre, f_pre, c_pre = gates[:, :n], gates[:, n : 2 * n], gates[:, 2 * n : 3 * n], gates[:, 3 * n :]
    i = _apply(f, _clip(i_pre + pi * c if pi is not None else i_pre, clip))
    fg = 1 - i if input_forget else _apply(f, _clip(f_pre + pf * c if pf is not None else f_pre, clip))
    c_new = fg * c + i * _apply(g, _clip(c_pre, clip))
    o = _apply(f, _clip(o_pre + po * c_new if po is not None else o_pre, clip))
    return o * _apply(hact, c_new), c_new


def run_recurrent(
    kind: str, x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, opt: tuple[torch.Tensor | None, ...],
    literals: tuple[Any, ...],
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """ONNX RNN / GRU / LSTM: (Y, Y_h) or (Y, Y_h, Y_c). `opt`: B, sequence_lens, initial_h (and
    initial_c, P), None where absent; `literals`: direction, hidden_size, activations, clip, layout,
    linear_before_reset, input_forget."""
    direction, n_hidden, acts, clip, layout, lbr, input_forget = literals
    b, lens, h0 = opt[0], opt[1], opt[2]
    c0, p = (opt[3], opt[4]) if kind == "LSTM" else (None, None)
    out_dtype = x.dtype
    work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype

    def prep(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(work)

    xs, w, r = x.to(work), w.to(work), r.to(work)
    b, h0, c0, p = (prep(t) for t in (b, h0, c0, p))
    if layout:  # [B, T, I] and states [B, D, H]
        xs = xs.transpose(0, 1)
        h0 = None if h0 is None else h0.transpose(0, 1)
        c0 = None if c0 is None else c0.transpose(0, 1)
    n_dirs = 2 if direction == "bidirectional" else 1
    batch = xs.shape[1]
    zeros = xs.new_zeros((n_dirs, batch, n_hidden))
    h0 = zeros if h0 is None else h0
    if kind == "LSTM" and c0 is None:
        c0 = zeros
    per_dir = len(acts) // n_dirs
    ys, hs, cs = [], [], []
    for d in range(n_dirs):
        back = direction == "reverse" or d == 1
        xd = _reverse(xs, lens) if back else xs
        y, h, c = _direction(
            kind, xd, w[d], r[d], None if b is None else b[d], h0[d], None if c0 is None else c0[d],
            None if p is None else p[d], acts[d * per_dir : (d + 1) * per_dir], clip, lens, lbr, input_forget,
        )  # fmt: skip
        ys.append(_reverse(y, lens) if back else y)
        hs.append(h)
        if c is not None:
            cs.append(c)
    y_all, h_all = torch.stack(ys, 1), torch.stack(hs)  # [T, D, B, H], [D, B, H]
    c_all = torch.stack(cs) if cs else None
    if layout:
        y_all, h_all = y_all.permute(2, 0, 1, 3), h_all.transpose(0, 1)
        c_all = None if c_all is None else c_all.transpose(0, 1)
    outs = [y_all, h_all] + ([c_all] if c_all is not None else [])
    return tuple(o.to(out_dtype).contiguous() for o in outs)


RECURRENT_TARGET = register_target("autofusion_onnx.recurrent.default", run_recurrent)
