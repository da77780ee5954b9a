"""Render GEMM + epilogue kernels: a plan step whose kernel runs a GEMM block by block (plan/schedule.py's
`KernelStep.gemm`, fusion/gemm.py).

In: such steps. Out: C++ for each (a static `<name>_body(bufs, P)` and the exported `<name>`, the same
contract as render.py's kernels, so the per-kernel executor and SuperKernel entries call it like any
other kernel) and its parameter values; plus, once per translation unit, the GEMM pointer the runtime
installs after loading (`af_gemm_install`, a Fortran-ABI sgemm_ found by runtime/blas.py) and a
counter of blocks run (`af_gemm_blocks`, which tests read to prove the fused path ran).

The body is an orphaned `omp for` over blocks of whole GEMM rows: each iteration is one sgemm call for
the block (inside a parallel region each thread's call runs on that thread alone: nested regions
get one thread, so the BLAS does not oversubscribe the cores) and then the epilogue over that block,
while its output is still in the core's cache. When nothing else reads the GEMM output, a block goes
to a per-thread scratch buffer that stays in cache instead of into a full-size intermediate. The
epilogue is the group's loop kernel rendered over one block's space with render.py's own body (its
worksharing line removed: each thread runs its own blocks); every buffer pointer is moved to the
block's origin by its step per index of the blocked dim (fusion/gemm.py checks the steps exist).
Outside a parallel region (small outputs) the blocks run in turn on the calling thread and each BLAS
call brings its own threads.
"""

from __future__ import annotations

from dataclasses import replace

from autofusion.codegen.cpp.render import PARALLEL_MIN, STORAGE, _body, _with_param_locals, parallel_pragma
from autofusion.kernel.lower import LoopKernel
from autofusion.kernel.tile import Tile
from autofusion.plan.schedule import KernelStep

GEMM_HELPER = r"""
// GEMM + epilogue kernels: the sgemm_ the runtime installs, per-thread block scratch, a block counter.
typedef void (*af_gemm_t)(const char*, const char*, const int*, const int*, const int*, const float*,
                          const float*, const int*, const float*, const int*, const float*, float*,
                          const int*);
static af_gemm_t af_gemm_fn = nullptr;
static int64_t af_gemm_count = 0;
extern "C" void af_gemm_install(void* fn) { af_gemm_fn = (af_gemm_t)fn; }
extern "C" int64_t af_gemm_blocks() { return __atomic_load_n(&af_gemm_count, __ATOMIC_RELAXED); }
static float* af_gemm_scratch(int64_t n) {
  static thread_local float* buf = nullptr;
  static thread_local int64_t cap = 0;
  if (n > cap) {
    std::free(buf);
    buf = (float*)std::aligned_alloc(64, (sizeof(float) * (size_t)n + 63) / 64 * 64);  // cache lines
    cap = n;
  }
  return buf;
}
// y[rows, N] = x[rows, K] @ B (+ bias[N]), row-major; B is w[K, N] (w_kn) or w[N, K] transposed.
// Column-major sgemm: y^T (N x rows) = B^T (N x K) * x^T (K x rows).
static void af_gemm_rows(const float* x, const float* w, const float* bias, float* y, int64_t rows,
                         int64_t N, int64_t K, bool w_kn) {
  if (bias) for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * N, bias, sizeof(float) * N);
  const int m = (int)N, n = (int)rows, k = (int)K, lda = w_kn ? (int)N : (int)K, ldb = (int)K, ldc = (int)N;
  const float alpha = 1.0f, beta = bias ? 1.0f : 0.0f;
  af_gemm_fn(w_kn ? "N" : "T", "N", &m, &n, &k, &alpha, w, &lda, x, &ldb, &beta, y, &ldc);
  __atomic_add_fetch(&af_gemm_count, 1, __ATOMIC_RELAXED);
}
"""

_WORKSHARE = "  #pragma omp for schedule(static) nowait"
_HEAD = 10  # fixed parameters before the buffer shifts (see render_gemm_step)


def _serial_body(k: LoopKernel, tile: Tile) -> tuple[str, list[int]]:
    """render.py's body for a pointwise kernel without its worksharing line: the caller's thread
    runs all of it (each thread calls it on its own block)."""
    lines, params, _ = _body(k, tile)
    hits = [i for i, line in enumerate(lines) if line == _WORKSHARE]
    if len(hits) != 1:
        raise RuntimeError(f"{k.name}: expected one worksharing loop in a pointwise body, found {len(hits)}")
    del lines[hits[0]]
    return _with_param_locals(lines, params), params


def render_gemm_step(step: KernelStep, threads: int = 0) -> tuple[str, list[int]]:
    """C++ for one GEMM + epilogue step and its parameter array P:
    P[0] elements (M*N, the entries' parallel switch), P[1..3] M N K, P[4] blocks, P[5] units per
    block, P[6] units in all, P[7] GEMM rows per unit, P[8] and P[9] where the full and the last
    block's epilogue parameters start, then one pointer step (elements per unit) per epilogue buffer."""
    spec = step.gemm
    assert spec is not None
    if spec.fit.whole:
        return _render_whole(step, threads)
    k = step.kernel
    ops, fit = spec.operands, spec.fit
    name = step.name
    space = k.space
    d = fit.block_dim
    tail_units = spec.units_total - (spec.blocks - 1) * spec.units
    full_k = replace(k, name=f"{name}_epi", space=(*space[:d], spec.units, *space[d + 1 :]))
    full_src, full_p = _serial_body(full_k, step.tile)
    # The last block's body is rendered even when it is a full one: sizes come from P, so the source
    # then stays the same for every shape of this loop structure (one library serves them all).
    tail_k = replace(k, name=f"{name}_tail", space=(*space[:d], tail_units, *space[d + 1 :]))
    tail_src, tail_p = _serial_body(tail_k, step.tile)
    texts = [full_src, tail_src]
    tail_fn = f"{name}_tail_body"
    slot = {v: i for i, v in enumerate((*step.inputs, *step.outputs))}
    nb = len(k.buffers)
    head = [ops.m * ops.n, ops.m, ops.n, ops.k, spec.blocks, spec.units, spec.units_total, fit.unit_rows]
    off_full = _HEAD + nb
    params = [*head, off_full, off_full + len(full_p), *fit.shifts, *full_p, *tail_p]
    assert len(head) + 2 == _HEAD
    bias = f"(const float*)bufs[{slot[ops.bias]}]" if ops.bias is not None else "nullptr"
    scratch = "yfull + m0 * N" if spec.y_out else "af_gemm_scratch(rows * N)"
    ptrs = []
    for i, b in enumerate(k.buffers):
        if i == fit.y_buf:
            ptrs.append("(char*)yb")
            continue
        size = _elem_size(STORAGE[b.type.dtype])
        ptrs.append(f"(char*)bufs[{slot[b.vid]}] + P[{_HEAD + i}] * u0 * {size}")
    lines = [
        *_head(step, slot, bias),
        "  #pragma omp for schedule(static) nowait",
        *_block_loop(scratch, ops.w_kn),
        f"    char* const t[] = {{{', '.join(ptrs)}}};",
        f"    if (nu == units) {name}_epi_body(t, P + P[8]);",
        f"    else {tail_fn}(t, P + P[9]);",
        "  }",
        "}",
        *_entry(name, threads),
    ]
    return "\n".join([*texts, *lines]), params


def _head(step: KernelStep, slot: dict[int, int], bias: str) -> list[str]:
    spec = step.gemm
    assert spec is not None
    ops = spec.operands
    return [
        f"static void {step.name}_body(char* const* bufs, const int64_t* __restrict P) {{",
        "  const int64_t N = P[2], K = P[3], blocks = P[4], units = P[5];",
        "  const int64_t units_all = P[6], unit_rows = P[7];",
        f"  const float* x = (const float*)bufs[{slot[ops.x]}];",
        f"  const float* w = (const float*)bufs[{slot[ops.w]}];",
        f"  const float* bias = {bias};",
        f"  float* yfull = {f'(float*)bufs[{slot[ops.y]}]' if spec.y_out else 'nullptr'};",
        "  (void)yfull;",
    ]


def _block_loop(scratch: str, w_kn: bool) -> list[str]:
    return [
        "  for (int64_t blk = 0; blk < blocks; ++blk) {",
        "    const int64_t u0 = blk * units;",
        "    const int64_t nu = std::min<int64_t>(units, units_all - u0);",
        "    const int64_t m0 = u0 * unit_rows, rows = nu * unit_rows;",
        f"    float* yb = {scratch};",
        f"    af_gemm_rows(x + m0 * K, w, bias, yb, rows, N, K, {'true' if w_kn else 'false'});",
    ]


def _render_whole(step: KernelStep, threads: int) -> tuple[str, list[int]]:
    """Whole mode (fusion/gemm.py): the blocks' GEMM calls shared by the team, the implied barrier of
    their `omp for`, then the epilogue as render.py renders it (its own worksharing) over the full
    output. P as for blocks, with P[8] where the epilogue's parameters start (P[9] unused)."""
    spec = step.gemm
    assert spec is not None
    ops, k, name = spec.operands, step.kernel, step.name
    lines, epi_p, _ = _body(replace(k, name=f"{name}_epi"), step.tile)
    epi_src = _with_param_locals(lines, epi_p)
    slot = {v: i for i, v in enumerate((*step.inputs, *step.outputs))}
    head = [ops.m * ops.n, ops.m, ops.n, ops.k, spec.blocks, spec.units, spec.units_total, spec.fit.unit_rows]
    params = [*head, _HEAD + len(k.buffers), 0, *spec.fit.shifts, *epi_p]
    bias = f"(const float*)bufs[{slot[ops.bias]}]" if ops.bias is not None else "nullptr"
    ptrs = [
        "(char*)yfull" if i == spec.fit.y_buf else f"bufs[{slot[b.vid]}]" for i, b in enumerate(k.buffers)
    ]
    body = [
        *_head(step, slot, bias),
        "  #pragma omp for schedule(static)",  # no nowait: the epilogue reads every block
        *_block_loop("yfull + m0 * N", ops.w_kn),
        "  }",
        f"  char* const t[] = {{{', '.join(ptrs)}}};",
        f"  {name}_epi_body(t, P + P[8]);",
        "}",
        *_entry(name, threads),
    ]
    return "\n".join([epi_src, *body]), params


def _entry(name: str, threads: int) -> list[str]:
    return [
        f'extern "C" void {name}(char* const* bufs, const int64_t* __restrict P) {{',
        f"  if (P[0] > {PARALLEL_MIN}) {{",
        "    " + parallel_pragma(threads),
        f"    {name}_body(bufs, P);",
        "  } else {",
        f"    {name}_body(bufs, P);  // no parallel region: the blocks in turn, each BLAS call threaded",
        "  }",
        "}",
    ]


def _elem_size(storage: str) -> int:
    return {
        "float": 4,
        "uint16_t": 2,
        "int32_t": 4,
        "int64_t": 8,
        "uint8_t": 1,
        "uint32_t": 4,
        "uint64_t": 8,
    }[storage]


def render_gemm_steps(steps: list[KernelStep], threads: int = 0) -> tuple[str, dict[str, list[int]]]:
    """The helper and every GEMM step's code (to append to render.py's unit), and their P values;
    `threads`: the entries' team size (render.parallel_pragma)."""
    if not steps:
        return "", {}
    texts, params = [GEMM_HELPER], {}
    for s in steps:
        text, p = render_gemm_step(s, threads)
        texts.append(text)
        params[s.name] = p
    return "\n".join(texts) + "\n", params
