"""The built-in models exported with torch.onnx.export and compiled from ONNX (equal to onnxruntime and
eager); the ONNX export of plans (fused kernels as `autofusion` functions that onnx.checker accepts) and
of rewritten graphs (which onnxruntime runs with equal results), from ONNX and from torch models."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import autofusion
from autofusion.export.onnx import FUNCTION_DOMAIN, export_graph, export_plan

N = helper.make_node
f32 = np.float32
BUILTINS = ["resnet-block", "transformer-block", "mlp", "layernorm", "softmax", "elementwise-chain"]


def export_builtin(name: str, **kw) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], bytes]:
    model, inputs = autofusion.builtin(name, **kw)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17)
    return model, inputs, buf.getvalue()


def _plan(cm):
    return cm.compiled.program.plan


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_from_onnx_equals_onnxruntime_and_eager(name: str, ort_run) -> None:
    model, inputs, data = export_builtin(name)
    cm = autofusion.compile(data)
    out = cm(*inputs)
    ref = ort_run(onnx.load_from_string(data), [t.numpy() for t in inputs])[0]
    torch.testing.assert_close(out, torch.from_numpy(ref), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(out, model(*inputs), rtol=1e-5, atol=1e-5)
    assert cm.stats["extern_calls"] == 0
    if name == "resnet-block":
        # The export folds BN into the convs: the conv rules without BN take both, as the torch route's
        # conv_bn rules do, and leave no kernel.
        assert cm.stats["rules"] == {"conv_relu": 1, "conv_add_relu": 1}, cm.stats.get("rules")
    else:
        assert cm.stats["fused_kernels"] >= 1


@pytest.mark.parametrize("name", BUILTINS)
def test_export_of_onnx_models(name: str, ort_run) -> None:
    _, inputs, data = export_builtin(name)
    cm = autofusion.compile(data)
    plan = _plan(cm)
    fused = export_plan(plan)
    onnx.checker.check_model(fused, full_check=True)
    kernels = [n for n in fused.graph.node if n.domain == FUNCTION_DOMAIN]
    assert len(kernels) == cm.stats["fused_kernels"] == len(fused.functions)
    assert all(f.domain == FUNCTION_DOMAIN and len(f.node) >= 1 for f in fused.functions)
    plain = export_graph(plan.graph)
    onnx.checker.check_model(plain, full_check=True)
    assert not plain.functions
    arrays = [t.numpy() for t in inputs]
    ref = ort_run(onnx.load_from_string(data), arrays)[0]
    for exported in (plain, fused):  # onnxruntime inlines functions, so it runs the fused export too
        np.testing.assert_allclose(ort_run(exported, arrays)[0], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet-block", "transformer-block"])
def test_export_of_torch_models_binds_the_weights(name: str, ort_run) -> None:
    model, inputs = autofusion.builtin(name)
    with torch.no_grad():
        cm = autofusion.compile(model, inputs)
        ref = model(*inputs)
    cg = cm.last
    weights = cg.plan_weights()  # parameters, buffers and what freezing folded from them
    fused = export_plan(cg.program.plan, weights=weights)
    onnx.checker.check_model(fused, full_check=True)
    assert [i.name for i in fused.graph.input] == ["x"]
    plain = export_graph(cg.program.plan.graph, weights=weights)
    np.testing.assert_allclose(ort_run(plain, [inputs[0].numpy()])[0], ref.numpy(), rtol=1e-5, atol=1e-5)


def test_extern_is_exported_as_its_onnx_node(onnx_model, ort_run) -> None:
    pytest.importorskip("onnxruntime")  # onnx.reference's CumSum rejects the 0-d axis input
    rng = np.random.default_rng(0)
    model = onnx_model(
        [
            N("Exp", ["x"], ["a"]),
            N("CumSum", ["a", "ax"], ["b"], reverse=0),
            N("TopK", ["b", "k"], ["v", "i"], axis=1),
            N("Mul", ["v", "v"], ["y"]),
        ],
        [("x", f32, [3, 6])],
        [("y", f32, [3, 2]), ("i", np.int64, [3, 2])],
        {"ax": np.array(1, np.int64), "k": np.array([2], np.int64)},
    )
    cm = autofusion.compile(model)
    assert cm.stats["extern_calls"] == 2
    x = rng.standard_normal((3, 6)).astype(f32)
    ref = ort_run(model, [x])
    fused = export_plan(_plan(cm), output_names=["y", "i"])
    onnx.checker.check_model(fused, full_check=True)
    assert {"CumSum", "TopK"} <= {n.op_type for n in fused.graph.node}
    for exported in (fused, export_graph(_plan(cm).graph, output_names=["y", "i"])):
        got = ort_run(exported, [x])
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)
        np.testing.assert_array_equal(got[1], ref[1])
    out = cm(x)
    np.testing.assert_allclose(out[0].numpy(), ref[0], rtol=1e-6)
    np.testing.assert_array_equal(out[1].numpy(), ref[1])


def test_export_covers_the_decomposed_ops(onnx_model, ort_run) -> None:
    # Decomposition leaves reductions, rsqrt, broadcasts and literals in the plan; all must export.
    rng = np.random.default_rng(2)
    inits = {
        "s": (1 + 0.1 * rng.standard_normal(8)).astype(f32),
        "b": rng.standard_normal(8).astype(f32),
        "m": rng.standard_normal(8).astype(f32),
        "v": (0.5 + rng.random(8)).astype(f32),
        "w": rng.standard_normal((8, 8, 1, 1)).astype(f32),
    }
    model = onnx_model(
        [
            N("Conv", ["x", "w"], ["c"]),
            N("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
            N("Transpose", ["n"], ["t"], perm=[0, 2, 3, 1]),
            N("LayerNormalization", ["t", "s", "b"], ["l"]),
            N("Softmax", ["l"], ["sm"], axis=-1),
            N("ReduceMean", ["sm"], ["y"], axes=[1, 2], keepdims=0),
        ],
        [("x", f32, [2, 8, 3, 5])],
        [("y", f32, [2, 8])],
        inits,
    )
    x = rng.standard_normal((2, 8, 3, 5)).astype(f32)
    cm = autofusion.compile(model)
    ref = ort_run(model, [x])[0]
    np.testing.assert_allclose(cm(x).numpy(), ref, rtol=1e-5, atol=1e-6)
    fused = export_plan(_plan(cm))
    onnx.checker.check_model(fused, full_check=True)
    for exported in (fused, export_graph(_plan(cm).graph)):
        np.testing.assert_allclose(ort_run(exported, [x])[0], ref, rtol=1e-5, atol=1e-6)


def test_aten_extern_of_a_torch_model_exports_in_the_aten_domain() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(torch.relu(x), 1).exp() * 2

    cm = autofusion.compile(f, (torch.randn(4, 8),))
    assert cm.stats["extern_calls"] == 1
    model = export_plan(cm.last.program.plan)
    onnx.checker.check_model(model, full_check=True)
    aten = [n for n in model.graph.node if n.domain == "org.pytorch.aten"]
    assert [n.op_type for n in aten] == ["cumsum"]
    assert helper.get_attribute_value(aten[0].attribute[0]) in (b"aten.cumsum.default", b"no converter")


def test_transformer_exported_with_a_dynamic_batch(ort_run) -> None:
    # The exporter writes Shape -> Gather -> Concat -> Reshape chains for the dynamic batch; they fold.
    model, inputs = autofusion.builtin("transformer-block")
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})  # fmt: skip
    proto = onnx.load_from_string(buf.getvalue())
    assert "Shape" in {n.op_type for n in proto.graph.node}
    cm = autofusion.compile(proto)
    for batch in (1, 3):
        x = torch.randn((batch, *inputs[0].shape[1:]))
        ref = ort_run(proto, [x.numpy()])[0]
        np.testing.assert_allclose(cm(x).numpy(), ref, rtol=1e-5, atol=1e-5)
        assert cm.stats["extern_calls"] == 0 and "Shape" not in str(cm.stats["op_counts"])
    assert cm.stats["signatures"] == 2


def test_export_keeps_a_newer_source_opset(onnx_model, ort_run) -> None:
    model = onnx_model([N("Gelu", ["x"], ["g"]), N("AveragePool", ["g"], ["y"], kernel_shape=[2, 2])],
                       [("x", f32, [1, 2, 6, 6])], [("y", f32, None)], opset=20)  # fmt: skip
    cm = autofusion.compile(model)
    fused = export_plan(_plan(cm), opset=20)
    onnx.checker.check_model(fused, full_check=True)
    assert [(o.domain, o.version) for o in fused.opset_import if o.domain == ""] == [("", 20)]
    x = np.random.default_rng(3).standard_normal((1, 2, 6, 6)).astype(f32)
    np.testing.assert_allclose(ort_run(fused, [x])[0], ort_run(model, [x])[0], rtol=1e-5, atol=1e-6)


def test_export_names_do_not_collide_with_input_names(onnx_model, ort_run) -> None:
    # Inputs named like the exporter's own value names once were (v<id>, helper constants).
    nodes = [N("Mul", ["v0", "c_1"], ["m"]), N("Add", ["m", "v3"], ["a"]), N("Softmax", ["a"], ["y"])]
    ins = [("v0", f32, [2, 5]), ("c_1", f32, [5]), ("v3", f32, [2, 1])]
    model = onnx_model(nodes, ins, [("y", f32, [2, 5])])
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(f32) for s in ((2, 5), (5,), (2, 1))]
    cm = autofusion.compile(model)
    ref = ort_run(model, arrays)[0]
    for exported in (export_plan(_plan(cm)), export_graph(_plan(cm).graph)):
        onnx.checker.check_model(exported, full_check=True)
        np.testing.assert_allclose(ort_run(exported, arrays)[0], ref, rtol=1e-5, atol=1e-6)
