"""Bad ONNX input gets a clear error that names the file and what is wrong: truncated or corrupt files,
opsets before 13, missing or short external data, and ops that can neither be converted nor run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import autofusion
from autofusion.errors import FrontendError, ModelFileError

N = helper.make_node
f32 = np.float32


def _mlp(onnx_model) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((16, 32)).astype(f32), "b": rng.standard_normal(32).astype(f32)}
    return onnx_model(
        [N("MatMul", ["x", "w"], ["m"]), N("Add", ["m", "b"], ["a"]), N("Relu", ["a"], ["y"])],
        [("x", f32, [4, 16])],
        [("y", f32, [4, 32])],
        inits,
    )


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_truncated_file(onnx_model, tmp_path: Path, fraction: float) -> None:
    data = _mlp(onnx_model).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelFileError, match=str(path)):
        autofusion.compile(path)


def test_not_an_onnx_file(tmp_path: Path) -> None:
    path = tmp_path / "text.onnx"
    path.write_text("this is not a model\n")
    with pytest.raises(ModelFileError, match="not a valid ONNX file"):
        autofusion.compile(str(path))
    with pytest.raises(ModelFileError, match="no such file"):
        autofusion.compile(str(tmp_path / "missing.onnx"))


def test_old_opset_the_converter_cannot_take_names_the_node(onnx_model) -> None:
    # Split-1 (split sizes as an attribute or a second input): onnx.version_converter has no adapter.
    nodes = [N("Relu", ["x"], ["r"]), N("Split", ["r"], ["y", "z"], name="halves", axis=0, split=[2, 2])]
    model = onnx_model(nodes, [("x", f32, [4])], [("y", f32, [2]), ("z", f32, [2])], opset=1)
    with pytest.raises(
        ModelFileError, match=r"opset 1 could not be converted.*'halves' \(Split\) at opset 1"
    ):
        autofusion.compile(model)


def _save_external(model: onnx.ModelProto, tmp_path: Path) -> Path:
    path = tmp_path / "ext.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # save_model moves the data out of the proto it is given
    onnx.save_model(
        copy,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.weights",
        size_threshold=0,
    )
    return path


def test_external_data_loads(onnx_model, ort_run, tmp_path: Path) -> None:
    model = _mlp(onnx_model)
    path = _save_external(model, tmp_path)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(f32)
    out = autofusion.compile(path)(x)
    np.testing.assert_allclose(out.numpy(), ort_run(model, [x])[0], rtol=1e-5, atol=1e-5)


def test_missing_external_data(onnx_model, tmp_path: Path) -> None:
    path = _save_external(_mlp(onnx_model), tmp_path)
    (tmp_path / "ext.weights").unlink()
    with pytest.raises(
        ModelFileError, match=r"tensor 'w' keeps its data in 'ext.weights', which does not exist"
    ):
        autofusion.compile(path)


def test_short_external_data(onnx_model, tmp_path: Path) -> None:
    path = _save_external(_mlp(onnx_model), tmp_path)
    weights = tmp_path / "ext.weights"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelFileError, match="shorter than"):
        autofusion.compile(path)


def test_external_data_needs_a_path(onnx_model, tmp_path: Path) -> None:
    path = _save_external(_mlp(onnx_model), tmp_path)
    proto = onnx.load(str(path), load_external_data=False)
    with pytest.raises(ModelFileError, match="load the model from its path"):
        autofusion.compile(proto)


def test_unknown_op_without_torch_implementation_names_the_node(onnx_model) -> None:
    graph = helper.make_graph(
        [N("Relu", ["x"], ["a"]), N("Frobnicate", ["a"], ["y"], domain="com.example", name="frob_1")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    with pytest.raises(
        FrontendError,
        match=r"node 'frob_1' \(com.example.Frobnicate, opset 1\) cannot be converted "
        r"\(no converter\) and has no torch implementation",
    ):
        autofusion.compile(model)


def test_control_flow_runs_as_the_node_named(onnx_model) -> None:
    # (If was refused before frontend/onnx/control.py; now its branches run, in an extern of its name.)
    branch = helper.make_graph(
        [N("Identity", ["x"], ["o"])], "b", [], [helper.make_tensor_value_info("o", 1, [3])]
    )
    model = onnx_model(
        [
            N("ReduceSum", ["x"], ["s"], keepdims=0),
            N("Greater", ["s", "z"], ["c"]),
            N("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="branchy"),
        ],
        [("x", f32, [3])],
        [("y", f32, [3])],
        {"z": np.array(0.0, f32)},
    )
    cm = autofusion.compile(model)
    x = np.array([1.0, -2.0, 3.0], f32)
    np.testing.assert_array_equal(cm(x).numpy(), x)
    assert [n.name for n in cm.graph.nodes if n.op == "extern"] == ["branchy"]


def test_undefined_input_is_a_file_error(onnx_model) -> None:
    model = _mlp(onnx_model)
    del model.graph.initializer[:]
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(32, f32), "b"))
    with pytest.raises(ModelFileError, match=r"<ModelProto>: .*'w'"):
        autofusion.compile(model)


def test_dynamic_dims_without_inputs_at_the_cli(onnx_model, tmp_path: Path, capsys) -> None:
    from autofusion.tools.cli import main as cli

    model = onnx_model([N("Relu", ["x"], ["y"])], [("x", f32, ["n", 3])], [("y", f32, ["n", 3])])
    path = tmp_path / "dyn.onnx"
    onnx.save(model, str(path))
    assert cli.main(["optimize", str(path)]) == 2
    assert "input 'x' dim 0 is dynamic ('n'); give its size with --dim n=SIZE" in capsys.readouterr().err
    assert cli.main(["optimize", str(path), "--dim", "n=5", "--check"]) == 0


def test_sparse_initializers_are_refused(onnx_model) -> None:
    model = _mlp(onnx_model)
    values = numpy_helper.from_array(np.ones(2, f32), "sp")
    indices = numpy_helper.from_array(np.array([0, 3], np.int64), "sp_idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    with pytest.raises(ModelFileError, match="sparse initializer 'sp'"):
        autofusion.compile(model)
