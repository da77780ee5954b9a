"""Scaled dot-product attention inside SuperKernel entries (a decode step's attention over its cache).

In: an `sdpa` op step and the value types (`plan/entry_ops.sdpa_in_entry` says whether an entry can
run it; `sdpa_params` gives its parameter block). Out: `ATTENTION_HELPER`, C++ defining

    static void af_sdpa_body(const float* q, const float* k, const float* v, const void* mask,
                             float* out, const int64_t* p)

out[b, h, i, :] = softmax_j(scale * q[b, h, i, :] . k[b, h, j, :] + mask[b, h, i, j]) @ v[b, h, j, :]
for float32 q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev], all contiguous; the mask is float32
(added) or bool (false: left out), broadcast from its own shape through strides (0 where broadcast);
`is_causal` leaves out j > i (torch's top-left alignment); a row with every key left out is zeros,
as torch's CPU attention gives. `af_sdpa_calls()` (exported) counts calls, so tests can prove the
entry ran it.

Why: one decode token attends over S cached keys with L = 1: 2 * H * S * E multiply-adds, a few
microseconds of work, while torch's call costs a dispatch and splits the SuperKernel in two (one more
return to Python, a new parallel region on each side).

How: rows (b, h, i) are shared between the threads of the entry's region (an orphaned `omp for`, a
member of a phase like a kernel body); per row one
pass for the scores (dot products over E), the max, exp (af_exp, vectorised) and sum, then one pass
accumulating the weighted values. Reduction order differs from torch's (float32 rounding level).
"""

from __future__ import annotations

import math
import struct

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Node
from autofusion.ir.types import TensorType

ATTENTION_HELPER = r"""
static int64_t af_sdpa_count = 0;
extern "C" int64_t af_sdpa_calls() { return __atomic_load_n(&af_sdpa_count, __ATOMIC_RELAXED); }

// p: B, H, L, S, E, Ev, mask kind (0 none, 1 float added, 2 bool kept where true), mask strides over
// (B, H, L, S), causal, the scale's float bits
// An orphaned `omp for nowait` over the rows: every thread of a region calls it (the caller places
// the barrier after it); outside a region the calling thread does every row.
static void af_sdpa_body(const float* q, const float* k, const float* v, const void* mask, float* out,
                         const int64_t* p) {
#ifdef _OPENMP
  if (omp_get_thread_num() == 0)
#endif
    __atomic_fetch_add(&af_sdpa_count, 1, __ATOMIC_RELAXED);
  const int64_t B = p[0], H = p[1], L = p[2], S = p[3], E = p[4], Ev = p[5], kind = p[6];
  const int64_t mb = p[7], mh = p[8], ml = p[9], ms = p[10];
  const bool causal = p[11] != 0;
  float scale;
  const int32_t bits = (int32_t)p[12];
  std::memcpy(&scale, &bits, sizeof(float));
  const int64_t rows = B * H * L;
  if (rows == 0 || Ev == 0) return;
  const float* fm = (const float*)mask;
  const uint8_t* bm = (const uint8_t*)mask;
  {
    float* sc = (float*)std::malloc(sizeof(float) * (S > 0 ? S : 1));
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % L, bh = r / L, h = bh % H, b = bh / H;
      const float* qr = q + r * E;
      const float* kb = k + bh * S * E;
      const float* vb = v + bh * S * Ev;
      float* o = out + r * Ev;
      const int64_t moff = b * mb + h * mh + i * ml;
      float m = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        float s;
        if ((causal && j > i) || (kind == 2 && !bm[moff + j * ms])) {
          s = -INFINITY;
        } else {
          const float* kr = kb + j * E;
          float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
          for (int64_t e = 0; e < E; ++e) acc += qr[e] * kr[e];
          s = acc * scale;
          if (kind == 1) s += fm[moff + j * ms];
        }
        sc[j] = s;
        m = s > m ? s : m;
      }
      for (int64_t e = 0; e < Ev; ++e) o[e] = 0.0f;
      if (m == -INFINITY) continue;  // every key left out: zeros, as torch
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < S; ++j) {
        const float e = af_exp(sc[j] - m);
        sc[j] = e;
        sum += e;
      }
      for (int64_t j = 0; j < S; ++j) {
        const float w = sc[j];
        if (w == 0.0f) continue;
        const float* vr = vb + j * Ev;
#pragma omp simd
        for (int64_t e = 0; e < Ev; ++e) o[e] += w * vr[e];
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t e = 0; e < Ev; ++e) o[e] *= inv;
    }
    std::free(sc);
  }
}
"""


def sdpa_work(params: list[int]) -> int:
    """Multiply-adds of one `af_sdpa_body` call (what decides whether a parallel region pays)."""
    b, h, length, s, e, ev = params[:6]
    return b * h * length * s * (e + ev)


def sdpa_params(node: Node, types: dict[int, TensorType]) -> list[int]:
    """The parameter block `af_sdpa_body` reads (see ATTENTION_HELPER) for a node `sdpa_in_entry` took."""
    q, k, v = (types[i] for i in node.inputs[:3])
    lead = (1,) * (4 - q.rank)
    b, h, length, e = (*lead, *q.shape)
    s, ev = k.shape[-2], v.shape[-1]
    kind, strides = 0, [0, 0, 0, 0]
    if node.attr("has_mask"):
        mask = types[node.inputs[3]]
        kind = 2 if mask.dtype is DType.bool else 1
        shape = (1,) * (4 - mask.rank) + mask.shape
        own = (0,) * (4 - mask.rank) + mask.strides
        strides = [0 if d == 1 else st for d, st in zip(shape, own, strict=True)]
    scale = node.attr("scale")
    if scale is None:
        scale = math.inf if e == 0 else 1.0 / math.sqrt(e)
    (bits,) = struct.unpack("<i", struct.pack("<f", scale))
    return [b, h, length, s, e, ev, kind, *strides, int(bool(node.attr("is_causal"))), bits]
