"""A matrix-vector product for one-row linears inside SuperKernel entries (a decode step's linears).

In: the team size of the helper's own region (`Options.kernel_threads`). Out: `gemv_helper(threads)`,
C++ defining

    static void af_gemv(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K)
    static void af_gemv_body(...)  // the same as an orphaned `omp for nowait`, for inside a region

y[n] = sum_k w[n, k] x[k] (+ b[n]) for a row-major, contiguous [N, K] weight, and `af_gemv_calls()`
(exported), a counter of calls that tests read to prove the entry ran it rather than the BLAS.

Why: with one row of activations a linear is a pass over its weight, memory-bound (2 flops per 4-byte
element); a BLAS sgemm called with M=1 pays its packing and blocking set-up for nothing. Measured on
the 2-core AVX-512 VM under load (single thread, CPU time, 14 distinct weights so they do not stay in
L2; [N, K] = [1536, 512], [512, 512], [2816, 512], [512, 1408]): this loop took 171/55/283/168 us
against F.linear's (MKL sgemm) 240/76/401/249, oneDNN's packed weight 204/82/325/244 and MKL's packed
GEMM 181/79/335/248.

How: four weight rows at a time against x (which stays in L1), each with 16 partial sums per lane so
the compiler keeps them in one vector register each; the lanes are added once at the end. The row
blocks are shared between the threads of the entry's parallel region (`af_gemv_body`, a member of
a phase like a kernel body), or of a region of its own (`af_gemv`) when the weight is large enough
to pay for one (`GEMV_PAR_MIN` multiply-adds). That region's team is `Options.kernel_threads`
(`gemv_helper(threads)`, the same `num_threads` clause as every other generated region). Summation order
differs from the BLAS's (results agree to float32 rounding, not bit for bit).
"""

from __future__ import annotations

from autofusion.codegen.cpp.render import parallel_pragma

GEMV_PAR_MIN = 1 << 16  # multiply-adds; below this one thread streams the weight faster than two start

_GEMV_TEXT = (
    r"""
#define AF_GEMV_PAR_MIN """
    + str(GEMV_PAR_MIN)
    + r"""LL
static int64_t af_gemv_count = 0;
extern "C" int64_t af_gemv_calls() { return __atomic_load_n(&af_gemv_count, __ATOMIC_RELAXED); }

// y[0..3] = w[0..3, :] . x, rows ldw apart
static inline void af_gemv4(const float* __restrict w, int64_t ldw, const float* __restrict x,
                            float* __restrict y, int64_t K) {
  float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
  const float* __restrict w0 = w;
  const float* __restrict w1 = w + ldw;
  const float* __restrict w2 = w + 2 * ldw;
  const float* __restrict w3 = w + 3 * ldw;
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
#pragma omp simd
    for (int l = 0; l < 16; ++l) {
      const float xv = x[k + l];
      a0[l] += w0[k + l] * xv;
      a1[l] += w1[k + l] * xv;
      a2[l] += w2[k + l] * xv;
      a3[l] += w3[k + l] * xv;
    }
  }
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
  for (; k < K; ++k) {
    const float xv = x[k];
    s0 += w0[k] * xv;
    s1 += w1[k] * xv;
    s2 += w2[k] * xv;
    s3 += w3[k] * xv;
  }
  for (int l = 0; l < 16; ++l) {
    s0 += a0[l];
    s1 += a1[l];
    s2 += a2[l];
    s3 += a3[l];
  }
  y[0] = s0;
  y[1] = s1;
  y[2] = s2;
  y[3] = s3;
}

static inline float af_gemv1(const float* __restrict w, const float* __restrict x, int64_t K) {
  float a[16] = {0};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
#pragma omp simd
    for (int l = 0; l < 16; ++l) a[l] += w[k + l] * x[k + l];
  }
  float s = 0.0f;
  for (; k < K; ++k) s += w[k] * x[k];
  for (int l = 0; l < 16; ++l) s += a[l];
  return s;
}

// Blocks of four rows (the last one shorter), bias included, as an orphaned `omp for nowait`: called
// by every thread of a region the team shares the blocks and the caller places the barrier; called
// outside any region the calling thread does them all.
static void af_gemv_body(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K) {
#ifdef _OPENMP
  if (omp_get_thread_num() == 0)
#endif
    __atomic_fetch_add(&af_gemv_count, 1, __ATOMIC_RELAXED);
  const int64_t blocks = (N + 3) / 4;
#pragma omp for schedule(static) nowait
  for (int64_t q = 0; q < blocks; ++q) {
    const int64_t n0 = 4 * q;
    if (n0 + 4 <= N) {
      af_gemv4(w + n0 * K, K, x, y + n0, K);
    } else {
      for (int64_t n = n0; n < N; ++n) y[n] = af_gemv1(w + n * K, x, K);
    }
    if (b)
      for (int64_t n = n0; n < N && n < n0 + 4; ++n) y[n] += b[n];
  }
}

// On its own (af_linear's one-row case): a parallel region of its own where the weight pays for one.
static void af_gemv(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K) {
AF_GEMV_PARALLEL if (N * K >= AF_GEMV_PAR_MIN)
  af_gemv_body(x, w, b, y, N, K);
}
"""
)


def gemv_helper(threads: int = 0) -> str:
    """The helper's C++ with its own region's team size: `threads` threads (0: OpenMP's default)."""
    return _GEMV_TEXT.replace("AF_GEMV_PARALLEL", parallel_pragma(threads))
