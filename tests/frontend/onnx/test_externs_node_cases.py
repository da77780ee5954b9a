"""The ONNX package's backend node cases for the ops frontend/onnx/externs/ implements, against the
cases' own expected outputs and tolerances.

Only single-node cases of those ops. The cases feed shape-like inputs (Resize's scales and sizes,
TopK's K, Col2Im's shapes...) as graph inputs; here they become initializers with the case's values,
as autofusion needs them known at import. Models below opset 13 load with the loader's floor lowered.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import autofusion

# Which inputs of each op are shape-like (known at import): they become initializers.
_BAKE: dict[str, tuple[int, ...]] = {
    "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2),
    "MaxUnpool": (2,), "AffineGrid": (1,),
}  # fmt: skip
_OPS = {
    "Resize", "Upsample", "GridSample", "AffineGrid", "MaxPool", "AveragePool", "LpPool", "MaxUnpool",
    "ScatterND", "ScatterElements", "Scatter", "GatherND", "TensorScatter", "TopK", "SpaceToDepth",
    "DepthToSpace", "Col2Im", "CenterCropPad", "DeformConv", "ConvTranspose", "ReverseSequence",
}  # fmt: skip
# Cases onnxruntime fails too (autofusion follows onnxruntime and the spec's text there), and bf16
# ones (numpy has no bfloat16 for the inputs).
_NOT_HERE = {
    "test_resize_downsample_scales_linear_align_corners": "align_corners with a fractional output width",
    "test_resize_downsample_scales_cubic_align_corners": "align_corners with a fractional output width",
    "test_maxunpool_export_with_output_shape": "onnxruntime's result differs from the expected output",
    "test_top_k_uint64": "onnxruntime has no uint64 TopK (and autofusion reads no uint64 inputs yet)",
}


def _cases() -> list:
    from onnx.backend.test.case.node import collect_testcases

    out = []
    for case in collect_testcases():
        if case.model is None or not case.data_sets or len(case.model.graph.node) != 1:
            continue
        node = case.model.graph.node[0]
        if node.op_type in _OPS and case.name not in _NOT_HERE and "bfloat16" not in case.name:
            out.append(case)
    return out


_CASES = _cases()


def _baked(case) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = model.graph.node[0]
    bake = {node.input[k] for k in _BAKE.get(node.op_type, ()) if k < len(node.input) and node.input[k]}
    inputs, keep = case.data_sets[0][0], []
    for vi, x in zip(list(model.graph.input), inputs, strict=True):
        if vi.name in bake:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(x), vi.name))
        else:
            keep.append((vi, x))
    del model.graph.input[:]
    model.graph.input.extend(vi for vi, _ in keep)
    return model, [x for _, x in keep]


def test_the_cases_are_found() -> None:
    assert len(_CASES) > 150, len(_CASES)


@pytest.mark.parametrize("case", _CASES, ids=[c.name for c in _CASES])
def test_node_case(case, monkeypatch) -> None:
    from autofusion.frontend.onnx import loader

    monkeypatch.setattr(loader, "MIN_OPSET", 9)
    model, inputs = _baked(case)
    cm = autofusion.compile(model)
    out = cm(*[torch.from_numpy(np.array(x)) for x in inputs])
    got = list(out) if isinstance(out, (tuple, list)) else [out]
    want = case.data_sets[0][1]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        a = g.numpy()
        assert (a.shape, a.dtype) == (w.shape, w.dtype)
        if a.dtype.kind == "f":
            np.testing.assert_allclose(
                a.astype(np.float64), w.astype(np.float64), rtol=case.rtol, atol=case.atol
            )
        else:
            np.testing.assert_array_equal(a, w)
