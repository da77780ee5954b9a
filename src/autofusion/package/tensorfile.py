"""The tensors of a package (format 2), stored raw so that loading maps them instead of reading them.

In (save): the tensors the pickled plans refer to (by index) and, with `weights="copy"`, the model's
weights (by name). Out: three zip members:
- `tensors.bin`, stored uncompressed: the bytes of every distinct storage, each starting at a file
  offset that is a multiple of `ALIGN`;
- `tensors.json`: per storage its offset in `tensors.bin` and size, per tensor its storage, dtype,
  shape, strides, storage offset and whether it was an `nn.Parameter`;
- `tensors.pt` (only when needed): tensors that have no plain byte layout (quantized, sparse, not on
  the CPU, conjugate or negative bit set, a tensor subclass), `torch.save`d as in format 1.

Loading (`read`) maps `tensors.bin` copy-on-write (`mmap.ACCESS_COPY`): a tensor is a view of the
mapping, its pages are read from the page cache when first touched, writing to it changes this
process's copy only, and tensors that shared a storage when saved share one again. Reading 150 MB of
BERT weights through `torch.load` took longer than the rest of loading together; mapping them takes
well under a millisecond. `save` replaces a package by renaming a new file over it, so a process that
mapped the old one keeps reading the old one. A storage whose mapped address is not `ALIGN`-aligned
(a zip tool rewrote the file, say) is copied into fresh memory instead, so kernels always see the
alignment torch's allocator gives. The zip CRC of `tensors.bin` is not checked when it is mapped:
checking it reads every byte (zlib's crc32 took 1.2-1.5 ms per MB on the loaded Xeon: 210-260 ms for the
benchmark BERT's 172 MB, against a 50 ms target for load to first result, and it would fault in every page
that mapping leaves untouched). `python -m zipfile -t PACKAGE` checks it; the zip's other members are
CRC-checked as they are read, and the libraries' sha256 is checked when they are installed.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import struct
import zipfile
from typing import Any

import torch

BIN = "tensors.bin"
INDEX = "tensors.json"
OTHER = "tensors.pt"
ALIGN = 64  # bytes: what torch's CPU allocator gives, and a cache line
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (30 bytes)
_ZIP64_EXTRA = 20  # bytes zipfile adds to the local header of a member it writes as zip64


def _raw(t: torch.Tensor) -> bool:
    """Whether `t`'s storage bytes, dtype, shape and strides make it again."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
    )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def write(z: zipfile.ZipFile, tensors: list[torch.Tensor], weights: dict[str, torch.Tensor]) -> None:
    """Write the members for `tensors` (the plan's, by index) and `weights` (by name) into `z`, which
    must be a zip file being written to a seekable file (its position says where the data lands)."""
    storages: dict[int, int] = {}  # storage address -> index in `blobs`
    blobs: list[torch.UntypedStorage] = []
    others: dict[str, torch.Tensor] = {}
    entries: dict[str, dict[str, Any]] = {}
    named = [(f"t{k}", t) for k, t in enumerate(tensors)] + [(f"w:{n}", t) for n, t in weights.items()]
    for key, t in named:
        if not _raw(t):
            others[key] = t
            continue
        s = t.untyped_storage()
        k = storages.get(s.data_ptr()) if s.nbytes() else None
        if k is None:
            k = len(blobs)
            blobs.append(s)
            if s.nbytes():
                storages[s.data_ptr()] = k
        entries[key] = {"storage": k, "dtype": _dtype_name(t.dtype), "shape": list(t.shape),
                        "stride": list(t.stride()), "offset": t.storage_offset(),
                        "parameter": isinstance(t, torch.nn.Parameter),
                        "requires_grad": t.requires_grad}  # fmt: skip
    size = sum(-(-s.nbytes() // ALIGN) * ALIGN for s in blobs) + ALIGN
    zip64 = size * 1.05 > zipfile.ZIP64_LIMIT
    # Where the member's data will start: after its local header, which zipfile writes at the current
    # position (30 bytes, the name, and a zip64 field when the member is large). Offsets are kept
    # relative to that start, so a wrong guess costs alignment (then `read` copies), never data.
    assert z.fp is not None
    start = z.fp.tell() + _LOCAL_HEADER.size + len(BIN.encode()) + (_ZIP64_EXTRA if zip64 else 0)
    at, placed = -start % ALIGN, []
    for s in blobs:
        placed.append({"at": at, "nbytes": s.nbytes()})
        at += -(-s.nbytes() // ALIGN) * ALIGN
    with z.open(zipfile.ZipInfo(BIN), "w", force_zip64=zip64) as out:
        pos = 0
        for s, p in zip(blobs, placed, strict=True):
            out.write(bytes(p["at"] - pos))
            if s.nbytes():
                out.write(torch.empty(0, dtype=torch.uint8).set_(s).numpy().data)
            pos = p["at"] + s.nbytes()
    z.writestr(INDEX, json.dumps({"storages": placed, "tensors": entries}), zipfile.ZIP_DEFLATED)
    if others:
        buf = io.BytesIO()
        torch.save(others, buf)
        z.writestr(OTHER, buf.getvalue())


def _data_offset(f: Any, info: zipfile.ZipInfo) -> int:
    f.seek(info.header_offset)
    header = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if header[0] != b"PK\x03\x04":
        raise ValueError(f"{info.filename}: bad local header")
    return info.header_offset + _LOCAL_HEADER.size + header[10] + header[11]


def read(
    path: str | os.PathLike[str], z: zipfile.ZipFile
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """(the plan's tensors by index, the copied weights by name) from a format-2 package."""
    index = json.loads(z.read(INDEX))
    info = z.getinfo(BIN)
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{BIN} is compressed; it must be stored")
    storages: list[torch.UntypedStorage] = []
    with open(path, "rb") as f:
        base = _data_offset(f, info)
        if base + info.file_size > os.fstat(f.fileno()).st_size:
            raise ValueError(f"{BIN} runs past the end of the file")
        mapped = None
        if info.file_size:
            page = base - base % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(f.fileno(), base + info.file_size - page, access=mmap.ACCESS_COPY, offset=page)
            base -= page
    for p in index["storages"]:
        at, n = int(p["at"]), int(p["nbytes"])
        if at < 0 or at + n > info.file_size:
            raise ValueError(f"{BIN}: a storage lies outside it")
        if n == 0:
            storages.append(torch.UntypedStorage(0))
            continue
        assert mapped is not None
        view = torch.frombuffer(mapped, dtype=torch.uint8, count=n, offset=base + at)
        if view.data_ptr() % ALIGN:
            view = view.clone()  # misaligned: fresh memory, as torch.load would give
        storages.append(view.untyped_storage())
    others: dict[str, torch.Tensor] = {}
    if OTHER in z.namelist():
        others = torch.load(io.BytesIO(z.read(OTHER)), weights_only=True)
    out: dict[str, torch.Tensor] = dict(others)
    for key, e in index["tensors"].items():
        dtype = getattr(torch, e["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{INDEX}: {e['dtype']!r} is no dtype")
        t = torch.empty(0, dtype=dtype).set_(storages[e["storage"]], e["offset"], e["shape"], e["stride"])
        if e["parameter"]:
            t = torch.nn.Parameter(t, requires_grad=e["requires_grad"])
        out[key] = t
    tensors = [out[f"t{k}"] for k in range(sum(1 for k in out if not k.startswith("w:")))]
    weights = {k[2:]: t for k, t in out.items() if k.startswith("w:")}
    return tensors, weights
