"""How close the decode step's GEMVs come to this machine's read bandwidth: the entry's GEMV helper
(codegen/cpp/gemv.py, built with the kernels' flags) over the eight weights of benchmarks/zoo.py's
llama_decode (2 layers: qkv [1536, 512], o [512, 512], gate/up [2816, 512], down [512, 1408]; 25.7 MB
of fp32) against a plain vector sum over the same bytes, in one parallel region with a barrier after
each weight as in the entry. Rounds alternate the two; min and p10 are printed (medians mean little on
a shared machine).

The sum is the floor a one-row fp32 decode step cannot beat: each weight byte is read once per token.
Where the GEMV matches it, the step is bound by the cores' read bandwidth (from L3 here: the weights
fit), and only reading fewer bytes or spending less outside the GEMVs makes it faster.

    python benchmarks/bench_gemv_floor.py [--threads 1 2] [--rounds 400]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from autofusion.codegen.cpp.build import DEFAULT_FLAGS
from autofusion.codegen.cpp.gemv import gemv_helper

SHAPES = ((1536, 512), (512, 512), (2816, 512), (512, 1408))
LAYERS = 2

_MAIN = r"""
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

struct W { int64_t n, k; float* w; };

// A vector sum over [p, p + n): the weight's bytes read once, nothing else done with them.
static float af_read(const float* __restrict p, int64_t n) {
  float a[32] = {0};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
#pragma omp simd
    for (int l = 0; l < 32; ++l) a[l] += p[i + l];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += p[i];
  for (int l = 0; l < 32; ++l) s += a[l];
  return s;
}

int main(int argc, char** argv) {
  const int threads = atoi(argv[1]), rounds = atoi(argv[2]);
  std::vector<W> ws;
  double bytes = 0;
  for (int l = 0; l < LAYERS; ++l)
    for (const auto& s : SHAPES) {
      W w{s[0], s[1], (float*)aligned_alloc(64, sizeof(float) * s[0] * s[1])};
      for (int64_t i = 0; i < s[0] * s[1]; ++i) w.w[i] = 1e-3f * (float)((i * 7) % 13);
      bytes += 4.0 * s[0] * s[1];
      ws.push_back(w);
    }
  std::vector<float> x(4096, 0.5f), y(4096);
  std::vector<double> tg, tr;
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    for (const auto& w : ws) {
      af_gemv_body(x.data(), w.w, nullptr, y.data(), w.n, w.k);
#pragma omp barrier
    }
    auto t1 = std::chrono::steady_clock::now();
    float s = 0;
#pragma omp parallel num_threads(threads) reduction(+ : s)
    for (const auto& w : ws) {
      const int64_t part = w.n * w.k / omp_get_num_threads();
      s += af_read(w.w + omp_get_thread_num() * part, part);
#pragma omp barrier
    }
    auto t2 = std::chrono::steady_clock::now();
    sink = sink + s + y[1];
    tg.push_back(std::chrono::duration<double>(t1 - t0).count());
    tr.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  std::sort(tg.begin(), tg.end());
  std::sort(tr.begin(), tr.end());
  const size_t p10 = tg.size() / 10;
  printf("threads %d, %.1f MB: GEMVs min %.3f p10 %.3f ms (%.1f GB/s); "
         "read min %.3f p10 %.3f ms (%.1f GB/s)\n",
         threads, bytes / 1e6, tg[0] * 1e3, tg[p10] * 1e3, bytes / tg[0] / 1e9, tr[0] * 1e3, tr[p10] * 1e3,
         bytes / tr[0] / 1e9);
  return 0;
}
"""


def source() -> str:
    shapes = ", ".join(f"{{{n}, {k}}}" for n, k in SHAPES)
    head = (
        "#include <cstdint>\n#include <cstring>\n#include <cmath>\n#include <omp.h>\n"
        f"static const int64_t SHAPES[][2] = {{{shapes}}};\nstatic const int LAYERS = {LAYERS};\n"
    )
    return head + gemv_helper(0) + _MAIN


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=400)
    a = ap.parse_args()
    flags = [f for f in DEFAULT_FLAGS if f not in ("-shared", "-fPIC")]
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "floor.cpp", Path(tmp) / "floor"
        src.write_text(source())
        subprocess.run(["g++", str(src), *flags, "-o", str(exe)], check=True)
        for t in a.threads:
            subprocess.run([str(exe), str(t), str(a.rounds)], check=True)


if __name__ == "__main__":
    main()
