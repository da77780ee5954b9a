"""Find a C-callable single-precision GEMM among the libraries this process already loaded.

Out: `sgemm_address()`, the address of a Fortran-ABI `sgemm_` with 32-bit integers (LP64), or None
with the reason in `sgemm_status()`. The SuperKernel entry calls it through a function pointer
passed at call time, so linear layers run inside the entry instead of returning to Python.

Where it looks: torch's CPU library (`libtorch_cpu.so`, which carries MKL on x86 wheels: the same
GEMM `torch.matmul` dispatches to), then numpy's OpenBLAS (its symbols are `scipy_`-prefixed and
64-bit-integer, `scipy_sgemm_64_`, so it is not ABI-compatible with the LP64 call and is skipped).
A candidate is accepted only after a 2x3 @ 3x2 product through it equals the known answer, which
also proves the integer width: an ILP64 library would read garbage sizes and fail the check.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from autofusion.errors import ExecutionError

log = logging.getLogger("autofusion.runtime")

_STATUS: list[str] = []


def _candidates() -> list[tuple[str, str]]:
    libdir = os.path.join(os.path.dirname(torch.__file__), "lib")
    return [(os.path.join(libdir, "libtorch_cpu.so"), "sgemm_")]


def _check(fn: Callable[..., Any]) -> bool:
    i32, f32 = ctypes.c_int, ctypes.c_float
    a = (f32 * 6)(1, 2, 3, 4, 5, 6)  # column-major 2x3: [[1,3,5],[2,4,6]]
    b = (f32 * 6)(1, 0, 0, 0, 1, 1)  # column-major 3x2: [[1,0],[0,1],[0,1]]
    c = (f32 * 4)(-1, -1, -1, -1)
    m, n, k = i32(2), i32(2), i32(3)
    one, zero = f32(1.0), f32(0.0)
    fn(b"N", b"N", ctypes.byref(m), ctypes.byref(n), ctypes.byref(k), ctypes.byref(one), a, ctypes.byref(m),
       b, ctypes.byref(k), ctypes.byref(zero), c, ctypes.byref(m))  # fmt: skip
    return list(c) == [1.0, 2.0, 8.0, 10.0]


@functools.cache
def sgemm_address() -> int | None:
    for path, symbol in _candidates():
        if not os.path.exists(path):
            _STATUS.append(f"{path}: not found")
            continue
        try:
            fn = getattr(ctypes.CDLL(path), symbol)
        except (OSError, AttributeError) as e:
            _STATUS.append(f"{path}: no {symbol} ({e})")
            continue
        if not _check(fn):
            _STATUS.append(f"{path}: {symbol} failed the LP64 check")
            continue
        _STATUS.append(f"{path}: {symbol}")
        log.debug("SuperKernel GEMM: %s from %s", symbol, path)
        return ctypes.cast(fn, ctypes.c_void_p).value
    log.info("no C-callable sgemm found (%s); linear layers split SuperKernels", "; ".join(_STATUS))
    return None


def sgemm_status() -> str:
    sgemm_address()
    return "; ".join(_STATUS)


def install_gemm(library: ctypes.CDLL) -> None:
    """Give a built library's GEMM + epilogue kernels (codegen/cpp/gemm.py) the sgemm they call.
    The plan holds such kernels only when the compiler found one; a library built in another process
    is given this process's."""
    addr = sgemm_address()
    if addr is None:
        why = sgemm_status()
        raise ExecutionError(f"the plan has GEMM + epilogue kernels but no C-callable sgemm: {why}")
    fn = library.af_gemm_install
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    fn(addr)


def gemm_blocks(library: ctypes.CDLL) -> int:
    """GEMM blocks the library's fused kernels ran since it was loaded (tests prove the fused path ran)."""
    fn = library.af_gemm_blocks
    fn.argtypes = []
    fn.restype = ctypes.c_int64
    return int(fn())
