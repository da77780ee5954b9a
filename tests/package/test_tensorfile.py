"""A package's tensors (format 2, `package/tensorfile.py`): stored raw, mapped copy-on-write at load.

Checked: every tensor comes back equal, with its dtype, shape, strides and storage offset; tensors that
shared a storage share one again (a view and its base, a weight the plan also holds); mapped data is
aligned to 64 bytes, also when the member landed misaligned (then it is copied); writing to a loaded
tensor leaves the file as it was; tensors with no plain byte layout go through `torch.save`; and a
package in format 1 (tensors and copied weights `torch.save`d) still loads and computes the same.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import autofusion
from autofusion.package import tensorfile


def _write(
    path: Path, tensors: list[torch.Tensor], weights: dict[str, torch.Tensor], first: bytes = b""
) -> None:
    with zipfile.ZipFile(path, "w") as z:
        if first:
            z.writestr("first.txt", first)
        tensorfile.write(z, tensors, weights)


def _read(path: Path) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    with zipfile.ZipFile(path) as z:
        return tensorfile.read(path, z)


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    assert a.storage_offset() == b.storage_offset()
    assert torch.equal(a, b) or (a.dtype.is_floating_point and torch.equal(a.isnan(), b.isnan()))


def _tensors() -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 10, generator=g)
    weight = torch.nn.Parameter(torch.randn(3, 5, generator=g), requires_grad=False)
    tensors = [
        base,
        base[1:4, 2:7],  # a view: shares base's storage, offset 12
        base.t(),  # other strides
        torch.tensor([float("nan"), float("inf"), -0.0, 1e-40]),  # special values, a denormal
        torch.randn(7, generator=g).to(torch.bfloat16),
        torch.randn(5, generator=g).to(torch.float16),
        torch.arange(9, dtype=torch.int64).reshape(3, 3),
        torch.tensor([True, False, True]),
        torch.tensor([1, 255], dtype=torch.uint8),
        torch.empty(0, 4),  # no bytes
        torch.tensor(3.5),  # 0-d
        weight,  # also a copied weight below: one storage
    ]
    return tensors, {"fc.weight": weight, "fc.bias": torch.randn(3, generator=g)}


def test_round_trip_keeps_values_layout_and_sharing(tmp_path: Path) -> None:
    tensors, weights = _tensors()
    path = tmp_path / "t.zip"
    _write(path, tensors, weights)
    got, got_w = _read(path)
    assert len(got) == len(tensors) and set(got_w) == set(weights)
    for a, b in zip(got, tensors, strict=True):
        _same(a, b)
    for name, w in weights.items():
        _same(got_w[name], w)
    assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    assert got[2].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    assert got_w["fc.weight"].untyped_storage().data_ptr() == got[-1].untyped_storage().data_ptr()
    assert isinstance(got[-1], torch.nn.Parameter) and not got[-1].requires_grad
    assert type(got[0]) is torch.Tensor
    for t in got:
        if t.untyped_storage().nbytes():
            assert t.untyped_storage().data_ptr() % tensorfile.ALIGN == 0


def test_writes_stay_in_this_process(tmp_path: Path) -> None:
    """The mapping is copy-on-write: a loaded tensor can be written, the package file does not change."""
    path = tmp_path / "t.zip"
    _write(path, [torch.arange(1000, dtype=torch.float32)], {})
    before = path.read_bytes()
    (t,), _ = _read(path)
    t.mul_(-1)
    assert path.read_bytes() == before
    (again,), _ = _read(path)
    assert torch.equal(again, torch.arange(1000, dtype=torch.float32))
    assert torch.equal(t, -again)


@pytest.mark.parametrize("shift", [1, 3, 17, 63])
def test_misaligned_member_is_copied_aligned(tmp_path: Path, shift: int) -> None:
    """A file rewritten with other member offsets (here: a member put first) loads the same, its
    storages copied to aligned memory."""
    tensors, weights = _tensors()
    path, moved = tmp_path / "t.zip", tmp_path / "moved.zip"
    _write(path, tensors, weights)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(moved, "w") as dst:
        dst.writestr("padding.txt", b"x" * shift)
        for info in src.infolist():
            dst.writestr(info, src.read(info.filename))
    starts = []
    for p in (path, moved):
        with open(p, "rb") as f, zipfile.ZipFile(p) as z:
            starts.append(tensorfile._data_offset(f, z.getinfo(tensorfile.BIN)))
    assert (starts[1] - starts[0]) % tensorfile.ALIGN, "the rewritten member is aligned: nothing is checked"
    got, got_w = _read(moved)
    for a, b in zip(got, tensors, strict=True):
        _same(a, b)
        if a.untyped_storage().nbytes():
            assert a.untyped_storage().data_ptr() % tensorfile.ALIGN == 0
    _same(got_w["fc.bias"], weights["fc.bias"])


@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized tensors are deprecated; they still save
def test_tensors_without_a_byte_layout_are_torch_saved(tmp_path: Path) -> None:
    q = torch.quantize_per_tensor(torch.tensor([0.5, -1.0, 2.0]), 0.1, 3, torch.quint8)
    z = torch.tensor([1 + 2j, 3 - 1j]).conj()
    path = tmp_path / "t.zip"
    _write(path, [torch.ones(2), q, z], {})
    with zipfile.ZipFile(path) as f:
        assert tensorfile.OTHER in f.namelist()
    got, _ = _read(path)
    assert torch.equal(got[0], torch.ones(2))
    assert got[1].is_quantized and torch.equal(got[1].int_repr(), q.int_repr())
    assert torch.equal(got[2].resolve_conj(), z.resolve_conj())


def test_a_corrupt_index_is_a_clear_error(tmp_path: Path) -> None:
    path, bad = tmp_path / "t.zip", tmp_path / "bad.zip"
    _write(path, [torch.ones(4)], {})
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == tensorfile.INDEX:
                index = json.loads(data)
                index["storages"][0]["nbytes"] = 1 << 40
                data = json.dumps(index).encode()
            dst.writestr(info, data)
    with pytest.raises(ValueError, match="outside"):
        _read(bad)


def _as_format_1(path: Path, out: Path) -> None:
    """`path` (format 2) rewritten as format 1 wrote it: tensors.pt (the plan's tensors as a list) and,
    for copied weights, weights.pt (a dict), both `torch.save`d."""
    tensors, weights = _read(path)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        manifest = json.loads(src.read("manifest.json"))
        manifest["format_version"] = 1
        for info in src.infolist():
            if info.filename in (tensorfile.BIN, tensorfile.INDEX, tensorfile.OTHER):
                continue
            data = json.dumps(manifest).encode() if info.filename == "manifest.json" else src.read(info)
            dst.writestr(info, data)
        for name, obj in (("tensors.pt", tensors), ("weights.pt", weights)):
            if name == "tensors.pt" or (manifest["weights"] == "copy" and weights):
                buf = io.BytesIO()
                torch.save(obj, buf)
                dst.writestr(name, buf.getvalue())


@pytest.mark.skipif(os.system("g++ --version > /dev/null 2>&1") != 0, reason="needs g++")
@pytest.mark.parametrize("weights", ["copy", "reference"])
def test_format_1_package_still_loads(tmp_path: Path, weights: str) -> None:
    torch.manual_seed(0)
    model, inputs = autofusion.builtin("transformer-block")
    model.eval()
    with torch.no_grad():
        cm = autofusion.compile(model, inputs)
        want = cm(*inputs)
    assert cm.stats["generated_calls"] > 0
    path, old = tmp_path / "m.afpkg", tmp_path / "old.afpkg"
    autofusion.save(cm, path, weights=weights)
    _as_format_1(path, old)
    kw: dict[str, Any] = {"model": model} if weights == "reference" else {}
    loaded = autofusion.load(old, **kw)
    with torch.no_grad():
        got = loaded(*inputs)
    assert torch.equal(got, want)
    assert loaded.stats["generated_calls"] > 0
