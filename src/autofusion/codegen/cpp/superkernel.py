"""Render SuperKernels: one exported C++ entry per `SuperKernel` of a `SuperPlan`.

In: the SuperPlan and each kernel's parameter values (render.py). Out: C++ source to append to the
graph's translation unit, and per entry a `SuperEntry`: which value fills each pointer slot and
the values of its parameter array.

    extern "C" void af_super_<i>(void* const* S, const int64_t* P, void* const* F)

S holds one pointer per value the entry touches (inputs, arena intermediates, outputs); P[0] says
whether to open parallel regions at all (some member has more than PARALLEL_MIN elements), then come
every member's own parameters; F holds library entry points (F[0]: a Fortran-ABI `sgemm_`, found in
a library torch already loaded, passed at call time; F[1], F[2] and the handles after them: the oneDNN
convolutions', plan/superkernel.DNNL_FIRST_HANDLE). Linears with one row run as a GEMV
(codegen/cpp/gemv.py), attention as af_sdpa (codegen/cpp/attention.py) and a static KV cache's row
writes as af_scatter (codegen/cpp/scatter.py), all in the entry's code. A scatter writes a graph input
in place and its result is that input: readers of the result get the input's pointer slot.

Inside the entry:
- all members small (P[0] == 0): every body in turn on the calling thread, no OpenMP at all (an
  orphaned `omp for` outside a region is the thread alone): a parallel region with barriers on a [64]
  tensor costs more than the work;
- otherwise one `omp parallel` region per run of kernel phases; every thread calls each member's
  body (orphaned `omp for nowait`: the team shares its iterations and nobody waits at its end);
  `omp barrier` only between phases (data flows across them), none inside a phase, so independent
  kernels overlap. A library call (BLAS) runs between two regions, on the calling thread, so it
  keeps its own threading; so does a oneDNN convolution (its primitive opens its own OpenMP region:
  it must not run inside ours). A failing one writes its reason to F[2] and the entry returns at once
  (the runtime raises it). One-row linears (GEMV) and attention are the entry's own code: phase
  members like kernel bodies (orphaned `omp for nowait`), so they share the region and its
  barriers; their size counts towards P[0].
The source depends only on the loop structure, not on the sizes (they are all in P), so a new batch
size with the same structure reuses the built library.
"""

from __future__ import annotations

import functools

from autofusion.codegen.cpp.attention import ATTENTION_HELPER, sdpa_params, sdpa_work
from autofusion.codegen.cpp.gemv import GEMV_PAR_MIN, gemv_helper
from autofusion.codegen.cpp.render import PARALLEL_MIN, parallel_pragma
from autofusion.codegen.cpp.scatter import SCATTER_HELPER, SCATTER_PAR_MIN, scatter_params, scatter_work
from autofusion.plan.entry_conv import conv_args
from autofusion.plan.entry_ops import REGION_KINDS
from autofusion.plan.entry_scatter import in_place_results, row_scatter
from autofusion.plan.schedule import KernelStep, OpStep
from autofusion.plan.superkernel import DNNL_ERR_LEN, SuperEntry, SuperKernel, SuperPlan, dnnl_handles

LINEAR_HELPER = r"""
// y[M,N] = x[M,K] * w[N,K]^T (+ b[N]), all row-major and contiguous, through a Fortran-ABI sgemm_
// (column-major: y^T = w * x^T). Sizes are int: LP64 BLAS, checked by the runtime before use.
typedef void (*af_sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*,
                           const float*, const int*, const float*, const int*, const float*, float*,
                           const int*);
// One row of x (a decode step's linears) is a pass over the weight: af_gemv (gemv.py), not the BLAS.
static void af_linear(void* fn, const float* x, const float* w, const float* b, float* y,
                      int64_t M, int64_t N, int64_t K) {
  if (M == 0 || N == 0) return;
  if (M == 1 && K > 0) {
    af_gemv(x, w, b, y, N, K);
    return;
  }
  if (b) {
    for (int64_t m = 0; m < M; ++m) std::memcpy(y + m * N, b, sizeof(float) * N);
  } else if (K == 0) {
    std::memset(y, 0, sizeof(float) * M * N);
  }
  if (K == 0) return;
  const int m = (int)M, n = (int)N, k = (int)K;
  const float alpha = 1.0f, beta = b ? 1.0f : 0.0f;
  ((af_sgemm_t)fn)("T", "N", &n, &m, &k, &alpha, w, &k, x, &k, &beta, y, &n);
}

// How sgemm (column-major) reads a row-major R x C matrix with strides (sr, sc) as its transpose
// (C x R): 'N' with ld = sr when rows are contiguous, 'T' with ld = sc when columns are. Strides of
// size-1 dims carry no meaning and are normalised first. False: neither (a naive loop then).
static bool af_as_colmajor_t(int64_t R, int64_t C, int64_t sr, int64_t sc, char* op, int* ld) {
  if (C <= 1) sc = 1;
  if (R <= 1) sr = sc == 1 ? (C > 1 ? C : 1) : 1;
  if (sc == 1 && sr >= (C > 1 ? C : 1)) { *op = 'N'; *ld = (int)sr; return true; }
  if (sr == 1 && sc >= (R > 1 ? R : 1)) { *op = 'T'; *ld = (int)sc; return true; }
  return false;
}

// c[b] = a[b] @ bm[b] for b < p[0]; p = batch, M, N, K, a strides (3), b strides (3); c is contiguous.
static void af_bmm(void* fn, const float* a, const float* bm, float* c, const int64_t* p) {
  const int64_t batch = p[0], M = p[1], N = p[2], K = p[3];
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) { std::memset(c, 0, sizeof(float) * batch * M * N); return; }
  char opa, opb; int lda, ldb;
  const bool blas = af_as_colmajor_t(M, K, p[5], p[6], &opa, &lda)
                    && af_as_colmajor_t(K, N, p[8], p[9], &opb, &ldb);
  const int m = (int)N, n = (int)M, k = (int)K, ldc = (int)N;
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t b = 0; b < batch; ++b) {
    const float* ab = a + b * p[4];
    const float* bb = bm + b * p[7];
    float* cb = c + b * M * N;
    if (blas) {
      // c^T (N x M, column-major) = bm^T (N x K) * a^T (K x M)
      ((af_sgemm_t)fn)(&opb, &opa, &m, &n, &k, &alpha, bb, &ldb, ab, &lda, &beta, cb, &ldc);
    } else {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          float acc = 0.0f;
          for (int64_t q = 0; q < K; ++q) acc += ab[i * p[5] + q * p[6]] * bb[q * p[8] + j * p[9]];
          cb[i * N + j] = acc;
        }
    }
  }
}
"""

DNNL_HELPER = r"""
// One oneDNN convolution through the dnnl glue's af_dnnl_conv_execute (codegen/cpp/dnnl_conv.cpp),
// whose address and the primitive's handle the runtime passes in F. Nonzero: it failed, reason in err.
typedef int32_t (*af_dnnl_exec_t)(void*, const void*, void*, const void*, char*, int64_t);
static int32_t af_dnnl_conv(void* fn, void* handle, const void* x, void* y, const void* res, void* err) {
  return ((af_dnnl_exec_t)fn)(handle, x, y, res, (char*)err, ERRLEN);
}
""".replace("ERRLEN", str(DNNL_ERR_LEN))


def render_super(
    splan: SuperPlan, kernel_params: dict[str, list[int]], threads: int = 0
) -> tuple[str, list[SuperEntry]]:
    """Each SuperKernel's entry and what the runtime passes it; `threads`: the team size of its
    parallel regions (render.parallel_pragma)."""
    plan = splan.plan
    types = plan.graph.value_types()
    texts: list[str] = (
        [gemv_helper(threads), LINEAR_HELPER, ATTENTION_HELPER, SCATTER_HELPER] if splan.callable_ops else []
    )
    handles = dnnl_handles(splan)
    if handles:
        texts.append(DNNL_HELPER)
    entries: list[SuperEntry] = []
    for sk in splan.super_kernels:
        slot_of: dict[int, int] = {}  # value id -> pointer slot, in first-use order
        slot = functools.partial(
            _slot, slot_of, in_place_results(splan.plan.steps, splan.callable_ops, sk.members)
        )

        header = [0]
        params: list[int] = []
        calls: dict[int, str] = {}  # member -> its call
        tables: list[str] = []
        any_big = False
        for j, m in enumerate(sk.members):
            step = plan.steps[m]
            off = len(header) + len(params)
            if isinstance(step, KernelStep):
                vals = kernel_params[step.name]
                big = vals[0] > PARALLEL_MIN  # the body's first parameter is its element count
                any_big |= big
                refs = ", ".join(f"(char*)S[{slot(v)}]" for v in step.inputs + step.outputs)
                tables.append(f"  char* const t{j}[] = {{{refs}}};")
                params += vals
                calls[m] = f"{step.name}_body(t{j}, P + {off});"
            elif splan.callable_ops.get(m) == "alias":
                continue  # a view: its pointer is filled in by the runtime, there is nothing to run
            elif splan.callable_ops.get(m) == "bmm":
                assert isinstance(step, OpStep)
                node = step.node
                a, b = node.inputs
                c = node.outputs[0].id
                batch, mm, kk = types[a].shape
                nn = types[b].shape[2]
                sa = splan.strides.get(a, types[a].strides)
                sb = splan.strides.get(b, types[b].strides)
                params += [batch, mm, nn, kk, *sa, *sb]
                call = (
                    f"af_bmm(F[0], (const float*)S[{slot(a)}], (const float*)S[{slot(b)}], "
                    f"(float*)S[{slot(c)}], P + {off});"
                )
                calls[m] = call
            elif splan.callable_ops.get(m) == "sdpa":
                assert isinstance(step, OpStep)
                node = step.node
                block = sdpa_params(node, types)
                params += block
                any_big |= sdpa_work(block) >= GEMV_PAR_MIN
                q, k, v = node.inputs[:3]
                mask = f"S[{slot(node.inputs[3])}]" if node.attr("has_mask") else "nullptr"
                calls[m] = (f"af_sdpa_body((const float*)S[{slot(q)}], (const float*)S[{slot(k)}], "
                            f"(const float*)S[{slot(v)}], {mask}, (float*)S[{slot(node.outputs[0].id)}], "
                            f"P + {off});")  # fmt: skip
            elif splan.callable_ops.get(m) == "scatter":
                assert isinstance(step, OpStep)
                sc = row_scatter(step.node)
                assert sc is not None
                block = scatter_params(step.node, types)
                params += block
                any_big |= scatter_work(block) >= SCATTER_PAR_MIN
                calls[m] = (f"af_scatter_body((char*)S[{slot(sc.target)}], S[{slot(sc.index)}], "
                            f"(const char*)S[{slot(sc.values)}], P + {off});")  # fmt: skip
            elif splan.callable_ops.get(m) == "dnnl_conv":
                assert isinstance(step, OpStep)
                ca = conv_args(step.node)
                assert ca is not None
                params.append(handles[m])
                res = "nullptr" if ca.other is None else f"S[{slot(ca.other)}]"
                x, y = slot(ca.x), slot(step.node.outputs[0].id)
                calls[m] = f"if (af_dnnl_conv(F[1], F[P[{off}]], S[{x}], S[{y}], {res}, F[2])) return;"
            elif splan.callable_ops.get(m) == "gemv":
                assert isinstance(step, OpStep)
                node = step.node
                x, w, y = node.inputs[0], node.inputs[1], node.outputs[0].id
                n, k = types[w].shape
                params += [n, k]
                any_big |= n * k >= GEMV_PAR_MIN
                bias = f"(const float*)S[{slot(node.inputs[2])}]" if node.attr("has_bias") else "nullptr"
                calls[m] = (f"af_gemv_body((const float*)S[{slot(x)}], (const float*)S[{slot(w)}], {bias}, "
                            f"(float*)S[{slot(y)}], P[{off}], P[{off + 1}]);")  # fmt: skip
            else:
                assert isinstance(step, OpStep) and step.node.op == "linear"
                node = step.node
                x, w = node.inputs[0], node.inputs[1]
                y = node.outputs[0].id
                k = types[x].shape[-1]
                n = types[w].shape[0]
                mm = types[y].numel // n if n else 0
                has_bias = bool(node.attr("has_bias"))
                bias = f"(const float*)S[{slot(node.inputs[2])}]" if has_bias else "nullptr"
                params += [mm, n, k]
                call = (f"af_linear(F[0], (const float*)S[{slot(x)}], (const float*)S[{slot(w)}], {bias}, "
                        f"(float*)S[{slot(y)}], P[{off}], P[{off + 1}], P[{off + 2}]);")  # fmt: skip
                calls[m] = call
        header[0] = int(any_big)
        lines = [f'extern "C" void {sk.name}(void* const* S, const int64_t* __restrict P, void* const* F) {{']
        lines += tables
        lines.append("  if (P[0]) {")
        lines += _parallel_body(sk, splan, calls, threads)
        lines.append("  } else {")
        lines += [f"    {calls[m]}" for m in sk.members if m in calls]
        lines.append("  }")
        lines.append("}")
        texts.append("\n".join(lines))
        entries.append(SuperEntry(sk.name, list(slot_of), header + params))
    return "\n".join(texts) + "\n", entries


def _slot(slot_of: dict[int, int], same: dict[int, int], v: int) -> int:
    v = same.get(v, v)
    return slot_of.setdefault(v, len(slot_of))


def _parallel_body(sk: SuperKernel, splan: SuperPlan, calls: dict[int, str], threads: int) -> list[str]:
    lines: list[str] = []
    region_open = False
    first_in_region = True
    for phase in sk.phases:
        code = [m for m in phase if m in calls]  # views run no code
        if not code:
            continue
        library = [m for m in code if m in splan.callable_ops and splan.callable_ops[m] not in REGION_KINDS]
        if library:
            if region_open:
                lines.append("    }")
                region_open = False
            lines += [f"    {calls[m]}" for m in library]
            continue
        if not region_open:
            lines += ["    " + parallel_pragma(threads), "    {"]
            region_open, first_in_region = True, True
        if not first_in_region:
            lines.append("      #pragma omp barrier")
        first_in_region = False
        lines += [f"      {calls[m]}" for m in code]
    if region_open:
        lines.append("    }")
    return lines
