"""In-place row scatters inside SuperKernel entries (a static KV cache's update).

In: a "scatter" op step (plan/entry_scatter.py says which an entry can run) and the value types. Out:
`SCATTER_HELPER`, C++ defining

    static void af_scatter_body(char* dst, const void* index, const char* src, const int64_t* p)

which, for the target viewed as [outer, size, inner] around the scatter's dim and the values as
[outer, n, inner], copies values[o, j, :] to target[o, index[j], :] (inner in bytes, so any dtype).
An index in [-size, size) counts from the end when negative, as torch's. Any other index: nothing is
written, `af_scatter_bad` (exported) is set, and the executor raises after the entry returns (the
entry cannot raise; torch would). `af_scatter_calls()` counts calls, so tests can prove the entry
wrote the cache rather than torch.

How: the rows (o, j) are shared between the threads of the entry's region (an orphaned `omp for
nowait`, like the entry's attention); every thread checks every index first, so all of them agree
on whether to write. Duplicate indices leave one of the rows, as torch's index_put_ and index_copy_
(their result is documented as undefined there).
"""

from __future__ import annotations

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Node
from autofusion.ir.types import TensorType
from autofusion.plan.entry_scatter import row_scatter

# Bytes a scatter copies before it alone makes the entry open parallel regions (a decode step's key
# row, 2 KiB a layer, is copied long before a second thread starts).
SCATTER_PAR_MIN = 1 << 20

SCATTER_HELPER = r"""
extern "C" { int64_t af_scatter_bad = 0; }
static int64_t af_scatter_count = 0;
extern "C" int64_t af_scatter_calls() { return __atomic_load_n(&af_scatter_count, __ATOMIC_RELAXED); }

// p: outer, size (the target's extent along the dim), n (index entries), inner bytes, index is int32
static void af_scatter_body(char* dst, const void* index, const char* src, const int64_t* p) {
  const int64_t outer = p[0], size = p[1], n = p[2], inner = p[3];
  const int64_t* i64 = (const int64_t*)index;
  const int32_t* i32 = (const int32_t*)index;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t k = p[4] ? (int64_t)i32[j] : i64[j];
    if (k < -size || k >= size) {
      __atomic_store_n(&af_scatter_bad, 1, __ATOMIC_RELAXED);
      return;
    }
  }
#ifdef _OPENMP
  if (omp_get_thread_num() == 0)
#endif
    __atomic_fetch_add(&af_scatter_count, 1, __ATOMIC_RELAXED);
#pragma omp for schedule(static) nowait
  for (int64_t r = 0; r < outer * n; ++r) {
    const int64_t o = r / n, j = r % n;
    int64_t k = p[4] ? (int64_t)i32[j] : i64[j];
    if (k < 0) k += size;
    std::memcpy(dst + (o * size + k) * inner, src + r * inner, (size_t)inner);
  }
}
"""


def scatter_params(node: Node, types: dict[int, TensorType]) -> list[int]:
    """The parameter block `af_scatter_body` reads for a scatter `scatter_in_entry` took."""
    sc = row_scatter(node)
    assert sc is not None
    dst, idx = types[sc.target], types[sc.index]
    dim = sc.axis(dst.rank)
    outer = 1
    for d in dst.shape[:dim]:
        outer *= d
    inner = dst.dtype.itemsize
    for d in dst.shape[dim + 1 :]:
        inner *= d
    return [outer, dst.shape[dim], idx.shape[0], inner, int(idx.dtype is DType.int32)]


def scatter_work(params: list[int]) -> int:
    """Bytes one call copies (what decides whether a parallel region pays)."""
    return params[0] * params[2] * params[3]
