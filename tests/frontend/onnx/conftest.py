"""Fixtures for the ONNX frontend tests: build a model with onnx.helper, run it with onnxruntime.

`onnx_model(nodes, inputs, outputs, inits=..., opset=...)` makes a checked ModelProto; `inputs`/`outputs`
are (name, numpy dtype, shape) triples, `inits` maps names to numpy arrays. `onnx_equal(model, *arrays)`
compiles the model with autofusion, runs it and onnxruntime (onnx.reference where onnxruntime is not
installed) on the same inputs, asserts the results match (fp32: rel 1e-5, fp16: 1e-2; ints and bools
exactly), checks that its kernels built and ran (`generated_code_ran`) and returns the compiled model.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import autofusion

try:
    import onnxruntime as ort
except ImportError:  # a test extra; onnx's own reference evaluator is the slower stand-in
    ort = None


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, Any, Sequence[Any]]],
    outputs: Sequence[tuple[str, Any, Sequence[Any] | None]],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    def vi(name: str, dtype: Any, shape: Sequence[Any] | None) -> onnx.ValueInfoProto:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))

    graph = helper.make_graph(
        list(nodes),
        "test",
        [vi(*i) for i in inputs],
        [vi(*o) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if any(o[2] is None for o in outputs):
        # Outputs given without a shape get the one ONNX infers (the checker wants a shape there).
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return model


def run_ort(model: onnx.ModelProto, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The model's outputs from onnxruntime (or onnx.reference when onnxruntime is not installed)."""
    if ort is None:
        from onnx.reference import ReferenceEvaluator

        ev = ReferenceEvaluator(model)
        outs = [np.ascontiguousarray(o) for o in ev.run(None, dict(zip(ev.input_names, arrays, strict=True)))]
        # The evaluator returns some 0-d results as shape (1,); the declared output shape is the spec's.
        for k, vi in enumerate(model.graph.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                shape = tuple(d.dim_value for d in dims)
                if outs[k].size == int(np.prod(shape)):
                    outs[k] = outs[k].reshape(shape)
        return outs
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays, strict=False)})


def assert_same(got: torch.Tensor, ref: np.ndarray, what: str = "") -> None:
    r = torch.from_numpy(np.asarray(ref))
    assert isinstance(got, torch.Tensor), what
    assert (got.dtype, tuple(got.shape)) == (r.dtype, tuple(r.shape)), (
        f"{what}: {got.dtype}{list(got.shape)} != ort {r.dtype}{list(r.shape)}"
    )
    if r.dtype.is_floating_point:
        tol = 1e-2 if r.dtype in (torch.float16, torch.bfloat16) else 1e-5
        torch.testing.assert_close(got, r, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, r), f"{what}: {got} != {r}"


def check(model: onnx.ModelProto, *arrays: np.ndarray, _ran: Any = None, **options: Any) -> Any:
    onnx.checker.check_model(model)
    ref = run_ort(model, arrays)
    cm = autofusion.compile(model, **options)
    out = cm(*arrays)
    outs = out if isinstance(out, tuple) else (out,)
    assert len(outs) == len(ref)
    for k, (g, r) in enumerate(zip(outs, ref, strict=False)):
        assert_same(g, r, f"output {k}")
    if _ran is not None:
        _ran(cm.stats, "autofusion.compile(onnx)")  # the kernels built, and ran where the plan has any
    return cm


@pytest.fixture
def onnx_model():
    return make_model


@pytest.fixture
def onnx_equal(generated_code_ran):
    return functools.partial(check, _ran=generated_code_ran)


@pytest.fixture
def ort_run():
    return run_ort


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
