"""`autofusion optimize --export` of an ONNX model with symbolic dims keeps its dynamic axes: input and
output dims carry the dim_param names, shapes are computed at run time, and onnxruntime runs the file
at several sizes with the source's results."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from autofusion.tools.cli import main as cli

ort = pytest.importorskip("onnxruntime")


class _Block(torch.nn.Module):
    def __init__(self, d: int = 16, h: int = 2) -> None:
        super().__init__()
        self.h, self.ln = h, torch.nn.LayerNorm(d)
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1) @ v
        return x + torch.relu(self.o(a.transpose(1, 2).reshape(b, t, d)))


def _source(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Block().eval(), (torch.randn(2, 5, 16),), buf, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}},
                          )  # fmt: skip
    path = tmp_path / "block.onnx"
    path.write_bytes(buf.getvalue())
    return path


def _dims(vi: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("flag", ["--export", "--export-plain"])
def test_export_keeps_dynamic_axes(tmp_path: Path, flag: str) -> None:
    src = _source(tmp_path)
    out = tmp_path / "out.onnx"
    argv = ["optimize", str(src), "--dim", "batch=3", "--dim", "seq=7", flag, str(out), "--repeat", "1"]
    assert cli.main(argv) == 0
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert _dims(model.graph.input[0]) == ["batch", "seq", 16]
    assert _dims(model.graph.output[0]) == ["batch", "seq", 16]
    if flag == "--export":
        assert any(f.domain == "autofusion" for f in model.functions)  # fused kernels are still functions
    exported, source = ort.InferenceSession(str(out)), ort.InferenceSession(str(src))
    rng = np.random.default_rng(0)
    for b, s in ((3, 7), (1, 1), (2, 5), (6, 33)):
        x = rng.standard_normal((b, s, 16)).astype(np.float32)
        want = source.run(None, {"x": x})[0]
        np.testing.assert_allclose(exported.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_a_writer_that_would_fix_a_symbolic_size_refuses() -> None:
    from autofusion.errors import ExportError
    from autofusion.export.onnx import export_graph
    from autofusion.ir.dtypes import DType
    from autofusion.ir.graph import GraphBuilder
    from autofusion.ir.symbolic import SymInt
    from autofusion.ir.types import TensorType

    b = GraphBuilder("g")
    x = b.add_input(TensorType(DType.float32, (SymInt.symbol("n", 4), 3)), "x")
    y = b.add("var", (x,), {"dims": (0,), "correction": 1, "keepdim": False})
    with pytest.raises(ExportError, match="cannot keep its dims symbolic"):
        export_graph(b.build([y]))


def test_an_export_that_cannot_keep_the_axes_says_so_and_fixes_them(tmp_path: Path, caplog) -> None:
    from onnx import TensorProto, helper

    # Pad by the size of dim 0 (pads computed from Shape): the IR pad holds a symbolic amount, which
    # its ONNX writer would fix, so the export keeps the compiled sizes and a warning says so.
    n = helper.make_node
    graph = helper.make_graph(
        [n("Shape", ["x"], ["s"]), n("Gather", ["s", "zero"], ["d0"], axis=0),
         n("Concat", ["zeros", "d0"], ["pads"], axis=0), n("Pad", ["x", "pads"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", None])],
        initializer=[helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
                     helper.make_tensor("zeros", TensorProto.INT64, [3], [0, 0, 0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "out.onnx"
    assert cli.main(["optimize", str(src), "--dim", "n=5", "--export-plain", str(out), "--repeat", "1"]) == 0
    assert "not its dynamic axes" in caplog.text and "cannot keep its dims symbolic" in caplog.text
    written = onnx.load(str(out))
    assert _dims(written.graph.input[0]) == [5, 4]
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    want = ort.InferenceSession(str(src)).run(None, {"x": x})[0]
    np.testing.assert_allclose(ort.InferenceSession(str(out)).run(None, {"x": x})[0], want)
