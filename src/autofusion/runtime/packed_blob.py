"""oneDNN-packed linear weights as plain bytes and back, so a package can store them (prepack.py packs).

In (`export`): a weight `torch.ops.mkldnn._reorder_linear_weight` made (an opaque `torch._mkldnn`
tensor: its bytes have no storage torch would hand out). Out: a uint8 tensor holding a copy of its
bytes and oneDNN's serialized memory descriptor (the blocked format, which depends on the CPU's ISA, the
dtype and the batch size it was packed for). `rebuild` makes the opaque tensor again over those bytes
(not a copy: the caller keeps the bytes alive as long as the tensor), through the same entry point
torch's ahead-of-time compiled models load their packed constants with
(`aoti_torch_create_tensor_from_blob_v2` with layout `_mkldnn`, exported by libtorch_cpu).

Why: packing the linear weights was most of a loaded BERT-base's first call (35 ms of it, with the
Q/K/V concatenation); rebuilding one over mapped package bytes takes well under a millisecond.

Only oneDNN's packed weights may be exported. MKL's (`torch.ops.mkl._mkl_reorder_linear_weight`) are
`torch._mkldnn` tensors too (a plain [bytes / 4 + 1, 1] fp32 descriptor over MKL's packed buffer), so
`export` cannot tell them apart and copies their bytes, but those bytes are not relocatable: measured
on the Xeon (torch 2.13, 768x768 and 3072x768 weights packed for 128 rows), a copy rebuilt at another
address, even one with the same offset in its 4 KiB page, gave wrong results and then a SIGFPE inside
`_mkl_linear`; only a copy at the same address modulo 64 KiB reproduced the result. The buffer is
also 2.2-4.9x the weight's size. Callers keep MKL-packed weights out (package/warm.py stores oneDNN's
only) and they are packed again at the first call.

The descriptor names a format this machine's oneDNN chose; a package records the CPU features it was
packed with and loading rebuilds only where they match (elsewhere the weight is packed again).
"""

from __future__ import annotations

import ctypes
import logging
import os
from functools import cache
from typing import Any

import torch

log = logging.getLogger("autofusion.runtime")

_DTYPES = {torch.float32: "aoti_torch_dtype_float32", torch.bfloat16: "aoti_torch_dtype_bfloat16"}


@cache
def _shim() -> tuple[Any, dict[torch.dtype, int], int, int, Any] | str:
    """(create, dtype codes, cpu device code, mkldnn layout code, PyCapsule_New), or why not."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        codes = {}
        for name in (*_DTYPES.values(), "aoti_torch_device_type_cpu", "aoti_torch_layout__mkldnn"):
            f = getattr(lib, name)
            f.restype, f.argtypes = ctypes.c_int32, []
            codes[name] = int(f())
        create = lib.aoti_torch_create_tensor_from_blob_v2
        i32, i64, p64 = ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
        create.restype = i32
        out = ctypes.POINTER(ctypes.c_void_p)
        create.argtypes = [ctypes.c_void_p, i64, p64, p64, i64, i32, i32, i32, out, i32, ctypes.c_char_p, i64]
        capsule = ctypes.pythonapi.PyCapsule_New
        capsule.restype, capsule.argtypes = (
            ctypes.py_object,
            [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p],
        )
        steal = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr
    except (OSError, AttributeError) as e:
        return f"torch offers no way to rebuild a packed weight from bytes here: {e}"
    dtypes = {dt: codes[name] for dt, name in _DTYPES.items()}
    return (create, dtypes, codes["aoti_torch_device_type_cpu"], codes["aoti_torch_layout__mkldnn"],
            (capsule, steal))  # fmt: skip


def export(packed: torch.Tensor) -> tuple[torch.Tensor, bytes] | None:
    """(a copy of the packed weight's bytes, its serialized descriptor); None for a weight that is no
    `torch._mkldnn` tensor of a dtype `rebuild` takes. The caller makes sure it is oneDNN's (module doc)."""
    if not packed.is_mkldnn or packed.dtype not in _DTYPES:
        return None
    try:
        nbytes = int(torch.ops.mkldnn._nbytes(packed))
        md = torch.ops.mkldnn._get_mkldnn_serialized_md(packed)
        src = int(torch.ops.mkldnn.data_ptr(packed))
    except (RuntimeError, AttributeError) as e:  # a torch without these entry points
        log.debug("packed weight not exported: %s", e)
        return None
    raw = torch.empty(nbytes, dtype=torch.uint8)
    ctypes.memmove(raw.data_ptr(), src, nbytes)
    return raw, md.numpy().tobytes()


def rebuild(
    raw: torch.Tensor, shape: list[int], stride: list[int], md: bytes, dtype: torch.dtype
) -> torch.Tensor | None:
    """The packed weight over `raw`'s bytes (kept alive by the caller), or None (the reason logged)."""
    shim = _shim()
    if isinstance(shim, str):
        log.info("prepack: %s; packing at the first call instead", shim)
        return None
    create, dtypes, cpu, layout, (capsule, steal) = shim
    if (
        raw.dtype != torch.uint8
        or not raw.is_contiguous()
        or dtype not in dtypes
        or len(shape) != len(stride)
    ):
        return None
    n = len(shape)
    handle = ctypes.c_void_p()
    sizes, strides = (ctypes.c_int64 * n)(*shape), (ctypes.c_int64 * n)(*stride)
    rc = create(raw.data_ptr(), n, sizes, strides, 0, dtypes[dtype], cpu, 0, ctypes.byref(handle), layout, md,
                len(md))  # fmt: skip
    if rc != 0 or not handle.value:
        log.info("prepack: a stored packed weight could not be rebuilt (code %d); packing it again", rc)
        return None
    out: torch.Tensor = steal(capsule(handle.value, None, None))
    if int(torch.ops.mkldnn._nbytes(out)) > raw.numel():  # a descriptor that does not fit its bytes
        log.info(
            "prepack: a stored packed weight's format needs more bytes than were stored; packing it again"
        )
        return None
    return out
