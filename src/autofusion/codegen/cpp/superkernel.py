"""Render SuperKernels: one exported C++ entry per `SuperKernel` of a `SuperPlan`.

In: the SuperPlan and each kernel's parameter values (render.py). Out: C++ source to append to the
graph's translation unit, and per entry a `SuperEntry`: which value fills each pointer slot and
the values of its parameter array.

    extern "C" void af_super_<i>(void* const* S, const int64_t* P, void* const* F)

S holds one pointer per value the entry touches (inputs, arena intermediates, outputs); P is a
header (P[0]: open a parallel region at all; P[1+j]: member j has more than PARALLEL_MIN elements)
followed by every member's own parameters; F holds library entry points (F[0]: a Fortran-ABI
`sgemm_`, found in a library torch already loaded, passed at call time).

Inside the entry:
- all members small (P[0] == 0): every kernel's serial body in turn on the calling thread, no
  OpenMP at all: a parallel region with barriers on a [64] tensor costs more than the work;
- otherwise one `omp parallel` region per run of kernel phases; a large member runs its team body
  (orphaned `omp for nowait`), a small one runs its serial body under `omp single nowait` so the
  other threads go on to the next independent member; `omp barrier` only between phases (data
  flows across them), none inside a phase. A library call (BLAS) runs between two regions, on the
  calling thread, so it keeps its own threading.
The source depends only on the loop structure, not on the sizes (they are all in P), so a new batch
size with the same structure reuses the built library.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from autofusion.codegen.cpp.render import PARALLEL_MIN
from autofusion.ir.dtypes import DType
from autofusion.ir.types import TensorType
from autofusion.plan.schedule import KernelStep, OpStep
from autofusion.plan.superkernel import SuperKernel, SuperPlan

LINEAR_HELPER = r"""
// y[M,N] = x[M,K] * w[N,K]^T (+ b[N]), all row-major and contiguous, through a Fortran-ABI sgemm_
// (column-major: y^T = w * x^T). Sizes are int: LP64 BLAS, checked by the runtime before use.
typedef void (*af_sgemm_t)(const char*, const char*, const int*, const int*, const int*, const float*,
                           const float*, const int*, const float*, const int*, const float*, float*, const int*);
static void af_linear(void* fn, const float* x, const float* w, const float* b, float* y,
                      int64_t M, int64_t N, int64_t K) {
  if (M == 0 || N == 0) return;
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
"""


@dataclass
class SuperEntry:
    name: str
    slots: list[int]  # value id held by each pointer slot
    params: list[int]  # the P array


def render_super(splan: SuperPlan, kernel_params: dict[str, list[int]]) -> tuple[str, list[SuperEntry]]:
    plan = splan.plan
    types = plan.graph.value_types()
    texts: list[str] = [LINEAR_HELPER] if splan.callable_ops else []
    entries: list[SuperEntry] = []
    for sk in splan.super_kernels:
        slot_of: dict[int, int] = {}  # value id -> pointer slot, in first-use order
        slot = functools.partial(_slot, slot_of)

        header = [0] * (1 + len(sk.members))
        params: list[int] = []
        calls: dict[int, tuple[str, str]] = {}  # member -> (team call, serial call)
        tables: list[str] = []
        any_big = False
        for j, m in enumerate(sk.members):
            step = plan.steps[m]
            off = len(header) + len(params)
            if isinstance(step, KernelStep):
                vals = kernel_params[step.name]
                big = vals[0] > PARALLEL_MIN  # the body's first parameter is its element count
                header[1 + j] = int(big)
                any_big |= big
                refs = ", ".join(f"(char*)S[{slot(v)}]" for v in step.inputs + step.outputs)
                tables.append(f"  char* const t{j}[] = {{{refs}}};")
                params += vals
                calls[m] = (f"{step.name}_team(t{j}, P + {off});", f"{step.name}_serial(t{j}, P + {off});")
            else:
                assert isinstance(step, OpStep) and step.node.op == "linear"
                node = step.node
                x, w = node.inputs[0], node.inputs[1]
                y = node.outputs[0].id
                k = types[x].shape[-1]
                n = types[w].shape[0]
                mm = types[y].numel // n if n else 0
                has_bias = bool(node.attr("has_bias"))
                b = f"(const float*)S[{slot(node.inputs[2])}]" if has_bias else "nullptr"
                params += [mm, n, k]
                call = (f"af_linear(F[0], (const float*)S[{slot(x)}], (const float*)S[{slot(w)}], {b}, "
                        f"(float*)S[{slot(y)}], P[{off}], P[{off + 1}], P[{off + 2}]);")  # fmt: skip
                calls[m] = (call, call)
        header[0] = int(any_big)
        lines = [f'extern "C" void {sk.name}(void* const* S, const int64_t* __restrict P, void* const* F) {{']
        lines += tables
        lines.append("  if (P[0]) {")
        lines += _parallel_body(sk, splan, calls)
        lines.append("  } else {")
        lines += [f"    {calls[m][1]}" for m in sk.members]
        lines.append("  }")
        lines.append("}")
        texts.append("\n".join(lines))
        entries.append(SuperEntry(sk.name, list(slot_of), header + params))
    return "\n".join(texts) + "\n", entries


def _slot(slot_of: dict[int, int], v: int) -> int:
    return slot_of.setdefault(v, len(slot_of))


def _parallel_body(sk: SuperKernel, splan: SuperPlan, calls: dict[int, tuple[str, str]]) -> list[str]:
    lines: list[str] = []
    region_open = False
    index = {m: j for j, m in enumerate(sk.members)}
    for p, phase in enumerate(sk.phases):
        library = [m for m in phase if m in splan.callable_ops]
        if library:
            if region_open:
                lines.append("    }")
                region_open = False
            lines += [f"    {calls[m][1]}" for m in library]
            continue
        if not region_open:
            lines += ["    #pragma omp parallel", "    {"]
            region_open = True
        elif p > 0:
            lines.append("      #pragma omp barrier")
        for m in phase:
            team, serial = calls[m]
            j = index[m]
            lines += [f"      if (P[{1 + j}]) {{", f"        {team}", "      } else {",
                      "        #pragma omp single nowait", f"        {serial}", "      }"]  # fmt: skip
    if region_open:
        lines.append("    }")
    return lines


def linear_in_entry(step: OpStep, types: dict[int, TensorType]) -> str | None:
    """None when `step` (a linear op) can run inside a SuperKernel through BLAS sgemm, else why not."""
    node = step.node
    if node.op != "linear":
        what = node.attr("target") if node.op == "extern" else node.op
        return f"{what} runs through torch; only linear has a C-callable implementation (BLAS) here"
    ins = [types[i] for i in node.inputs]
    out = node.outputs[0].type
    if any(t.dtype is not DType.float32 for t in [*ins, out]):
        return "BLAS sgemm takes float32 only"
    if not all(t.is_contiguous for t in [*ins, out]):
        return "an operand is not contiguous"
    if max(out.numel, ins[0].numel, ins[1].numel) >= 2**31:
        return "sizes exceed a 32-bit BLAS"
    return None

