"""Old opsets and the ops of classic CNN exports, against onnxruntime.

Models at opsets 1-12 are converted on load (`frontend/onnx/opset.py`, `legacy.py`); LRN, pools with
asymmetric pads, Dropout with its mask and asymmetric Resize have converters (`converters/classic.py`).
Each test builds its model with onnx.helper (no downloads) and compares autofusion with onnxruntime;
where onnxruntime has no kernel (LRN of even size, BatchNormalization below opset 7) or departs from
the spec (Dropout's mask below opset 12), the reference is the spec's formula, written out in numpy.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import autofusion
from autofusion.errors import FrontendError, ModelFileError
from autofusion.frontend.onnx import opset as opset_mod

N = helper.make_node
f32, f16 = np.float32, np.float16


def _lowered(cm: autofusion.CompiledModel, op: str) -> None:
    """`op` became IR (not an extern of its own); the run went through generated code."""
    stats = cm.stats
    assert stats["lowered"].get(f"onnx.{op}", 0) >= 1, stats["lowered"]
    assert not any(k.startswith(f"onnx.{op}(") for k in stats["fallbacks"]), stats["fallbacks"]


# -- opset conversion --
@pytest.mark.parametrize("version", [1, 7, 9, 11, 12])
def test_old_opset_is_converted_and_logged(onnx_model, onnx_equal, rng, version: int, caplog) -> None:
    # Add's broadcast attribute (opsets 1-6) goes away on conversion (its adapter needs the input shapes).
    nodes = [N("Add", ["x", "b"], ["s"]), N("Relu", ["s"], ["r"]), N("Sigmoid", ["r"], ["y"])]
    model = onnx_model(nodes, [("x", f32, [3, 5]), ("b", f32, [3, 5])], [("y", f32, [3, 5])], opset=version)
    x, b = rng.standard_normal((2, 3, 5)).astype(f32)
    with caplog.at_level(logging.INFO, logger="autofusion.frontend"):
        if version < 7:  # onnxruntime runs opset 7 and newer only: compare with numpy
            out = autofusion.compile(model)(x, b)
            np.testing.assert_allclose(out.numpy(), 1 / (1 + np.exp(-np.maximum(x + b, 0))), rtol=1e-6)
        else:
            onnx_equal(model, x, b)
    assert f"converted from opset {version} to opset 13" in caplog.text


def test_cast_naming_its_type_as_a_string(onnx_model, rng) -> None:
    # Cast-1..5 has no adapter: it is written as Cast-13 with the type's number.
    nodes = [N("Cast", ["x"], ["h"], to="FLOAT16"), N("Cast", ["h"], ["y"], to="INT32")]
    model = onnx_model(nodes, [("x", f32, [5])], [("y", np.int32, [5])], opset=5)
    x = (rng.standard_normal(5) * 100).astype(f32)
    np.testing.assert_array_equal(autofusion.compile(model)(x).numpy(), x.astype(np.float16).astype(np.int32))


def test_model_of_another_domain_only_names_its_node() -> None:
    # No default-domain opset to convert: the error is the node's, not "no opset".
    # (an ml op onnx.reference does not implement: the ones it does run on it, externs/reference.py)
    node = N("CategoryMapper", ["x"], ["y"], domain="ai.onnx.ml", name="bin")
    vi = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [3]) for n in "xy"]
    graph = helper.make_graph([node], "ml", vi[:1], vi[1:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(
        FrontendError, match=r"'bin' \(ai.onnx.ml.CategoryMapper, opset 3\) cannot be converted"
    ):
        autofusion.compile(model)


def test_newer_than_onnx_knows_is_refused(onnx_model) -> None:
    newest = onnx.defs.onnx_opset_version()
    model = onnx_model([N("Relu", ["x"], ["y"])], [("x", f32, [3])], [("y", f32, [3])], opset=newest + 1)
    with pytest.raises(ModelFileError, match=rf"opset {newest + 1} is newer than the installed onnx"):
        autofusion.compile(model)


def test_newer_than_read_is_taken_down(onnx_model, onnx_equal, rng, monkeypatch, caplog) -> None:
    monkeypatch.setattr(opset_mod, "NEWEST_READ", 17)
    axes = np.asarray([1], dtype=np.int64)
    node = N("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    model = onnx_model([node], [("x", f32, [3, 4])], [("y", f32, [3])], {"axes": axes}, opset=18)
    with caplog.at_level(logging.INFO, logger="autofusion.frontend"):
        onnx_equal(model, rng.standard_normal((3, 4)).astype(f32))
    assert "converted from opset 18 to opset 17" in caplog.text


def test_newer_that_cannot_go_down_is_read_as_is(onnx_model, onnx_equal, rng, monkeypatch, caplog) -> None:
    monkeypatch.setattr(opset_mod, "NEWEST_READ", 19)  # Gelu is new in 20: no adapter takes it down
    model = onnx_model(
        [N("Gelu", ["x"], ["y"], name="g")], [("x", f32, [3, 4])], [("y", f32, [3, 4])], opset=20
    )
    with caplog.at_level(logging.INFO, logger="autofusion.frontend"):
        onnx_equal(model, rng.standard_normal((3, 4)).astype(f32))
    assert "opset 20 could not be converted to 19" in caplog.text
    assert "node 'g' (Gelu)" in caplog.text and "reading it at opset 20" in caplog.text


# -- Flatten --
@pytest.mark.parametrize(
    ("shape", "axis"), [((2, 3, 4, 5), a) for a in range(-4, 5)] + [((3, 4), -2), ((3, 4), -1)]
)
def test_flatten_every_axis(onnx_model, onnx_equal, rng, shape: tuple[int, ...], axis: int) -> None:
    model = onnx_model([N("Flatten", ["x"], ["y"], axis=axis)], [("x", f32, shape)], [("y", f32, None)])
    onnx_equal(model, rng.standard_normal(shape).astype(f32))


# -- LRN --
def _lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """The ONNX formula: channel c sums squares over [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    xd = x.astype(np.float64)
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.zeros_like(xd)
    for ch in range(c):
        sq[:, ch] = (xd[:, max(0, ch - lo) : min(c, ch + hi + 1)] ** 2).sum(axis=1)
    return xd / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize(
    ("size", "shape"), [(1, (2, 6, 5, 7)), (3, (1, 4, 3, 3)), (5, (2, 6, 5, 7)), (17, (1, 20, 3, 5))]
)
def test_lrn_fp32(onnx_model, onnx_equal, rng, size: int, shape: tuple[int, ...]) -> None:
    node = N("LRN", ["x"], ["y"], size=size, alpha=0.02, beta=0.6, bias=1.5)
    model = onnx_model([node], [("x", f32, shape)], [("y", f32, shape)])
    x = (rng.standard_normal(shape) * 3).astype(f32)
    cm = onnx_equal(model, x)
    _lowered(cm, "LRN")
    np.testing.assert_allclose(cm(x).numpy(), _lrn_reference(x, size, 0.02, 0.6, 1.5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("size", "shape"), [(2, (2, 5, 4, 3)), (4, (1, 7, 3)), (6, (1, 3, 2, 2, 2))])
def test_lrn_even_sizes_and_other_ranks(onnx_model, rng, size: int, shape: tuple[int, ...]) -> None:
    # onnxruntime takes odd sizes of 4-d tensors only; the window of an even size leans forward.
    model = onnx_model([N("LRN", ["x"], ["y"], size=size)], [("x", f32, shape)], [("y", f32, shape)])
    x = (rng.standard_normal(shape) * 2).astype(f32)
    cm = autofusion.compile(model)
    np.testing.assert_allclose(cm(x).numpy(), _lrn_reference(x, size, 1e-4, 0.75, 1.0), rtol=1e-5)
    _lowered(cm, "LRN")


def test_lrn_fp16(onnx_model, ort_run, rng, generated_code_ran) -> None:
    # onnxruntime's CPU LRN is fp32 only: the reference is its result on the same (fp16) values.
    shape = (2, 8, 5, 5)
    node = N("LRN", ["x"], ["y"], size=5, alpha=0.5, beta=0.75, bias=1.0)
    model16 = onnx_model([node], [("x", f16, shape)], [("y", f16, shape)])
    model32 = onnx_model([node], [("x", f32, shape)], [("y", f32, shape)])
    x = (rng.standard_normal(shape) * 40).astype(f16)  # squares past fp16's range: computed in fp32
    cm = autofusion.compile(model16)
    got = cm(x)
    generated_code_ran(cm.stats, "LRN fp16")
    (ref,) = ort_run(model32, [x.astype(f32)])
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, torch.from_numpy(ref.astype(f16)), rtol=1e-3, atol=1e-3)


# -- pools with asymmetric pads --
def _pool(op: str, shape: tuple[int, ...], k: list[int], s: list[int] | None, pads: list[int] | str, **kw):
    attrs = {"kernel_shape": k} | ({"strides": s} if s else {}) | kw
    attrs |= {"auto_pad": pads} if isinstance(pads, str) else {"pads": pads}
    return op, shape, attrs


MAX, AVG = "MaxPool", "AveragePool"
POOLS = [
    _pool(MAX, (1, 2, 7, 9), [3, 3], [2, 2], [0, 0, 1, 1]),
    _pool(MAX, (2, 3, 7, 7), [2, 2], [2, 2], "SAME_UPPER"),
    _pool(MAX, (1, 2, 7, 6), [4, 2], [1, 2], "SAME_LOWER"),
    _pool(MAX, (1, 2, 10, 10), [3, 3], [2, 2], [1, 0, 1, 1], ceil_mode=1),
    _pool(MAX, (1, 2, 9, 10), [3, 3], [2, 3], [0, 1, 1, 0], ceil_mode=1),
    _pool(MAX, (1, 2, 9, 9), [2, 2], None, [1, 0, 0, 1], dilations=[2, 2]),
    _pool(MAX, (1, 2, 9), [3], [2], [0, 2]),
    _pool(MAX, (1, 1, 4, 5, 6), [2, 2, 2], [2, 2, 2], [0, 1, 0, 1, 0, 1]),
    _pool(MAX, (1, 2, 5, 5), [3, 3], None, [2, 2, 2, 2]),  # symmetric, over half the window
    _pool(AVG, (1, 2, 7, 9), [3, 3], [2, 2], [0, 0, 1, 1]),
    _pool(AVG, (1, 2, 7, 9), [3, 3], [2, 2], [0, 0, 1, 1], count_include_pad=1),
    _pool(AVG, (2, 3, 7, 7), [2, 2], [2, 2], "SAME_UPPER"),
    _pool(AVG, (1, 2, 7, 6), [4, 2], None, "SAME_LOWER", count_include_pad=1),
    _pool(AVG, (1, 2, 10, 10), [3, 3], [2, 2], [1, 0, 1, 1], ceil_mode=1),
    _pool(AVG, (1, 2, 9, 10), [3, 3], [2, 3], [0, 1, 1, 0], ceil_mode=1, count_include_pad=1),
    _pool(AVG, (1, 2, 9), [4], [3], [0, 2], count_include_pad=1),
    _pool(AVG, (1, 1, 5, 4, 6), [2, 3, 2], [2, 1, 2], [1, 0, 0, 0, 2, 1]),
    _pool(AVG, (1, 2, 5, 5), [3, 3], [2, 2], [2, 2, 2, 2], count_include_pad=1),
]


@pytest.mark.parametrize(("op", "shape", "attrs"), POOLS, ids=[f"{p[0]}-{i}" for i, p in enumerate(POOLS)])
def test_pool_with_pads_aten_does_not_take(onnx_model, onnx_equal, rng, op, shape, attrs) -> None:
    model = onnx_model([N(op, ["x"], ["y"], **attrs)], [("x", f32, shape)], [("y", f32, None)], opset=19)
    x = rng.standard_normal(shape).astype(f32)
    _lowered(onnx_equal(model, x), op)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool_with_asymmetric_pads_fp16(onnx_model, onnx_equal, rng, op: str) -> None:
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 0], "ceil_mode": 1}
    model = onnx_model(
        [N(op, ["x"], ["y"], **attrs)], [("x", f16, (2, 3, 8, 7))], [("y", f16, None)], opset=19
    )
    _lowered(onnx_equal(model, rng.standard_normal((2, 3, 8, 7)).astype(f16)), op)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_maxpool_with_asymmetric_pads_of_ints(onnx_model, onnx_equal, rng, dtype) -> None:
    # The pad is the type's smallest value: it never wins over the data.
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (1, 2, 6, 7), endpoint=True).astype(dtype)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [0, 1, 1, 0]}
    model = onnx_model([N("MaxPool", ["x"], ["y"], **attrs)], [("x", dtype, x.shape)], [("y", dtype, None)])
    _lowered(onnx_equal(model, x), "MaxPool")


def test_pool_where_onnx_inference_keeps_a_window_onnxruntime_drops(onnx_model) -> None:
    # ceil_mode: the last window would start in the right pad. onnxruntime (and onnx.reference) drop
    # it, ONNX shape inference keeps it; downstream shapes would all be off by one, so it is refused.
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 2, 1], "ceil_mode": 1}
    model = onnx_model([N("MaxPool", ["x"], ["y"], **attrs)], [("x", f32, (1, 1, 9, 9))], [("y", f32, None)])
    with pytest.raises(
        FrontendError, match=r"ONNX shape inference gives \(1, 1, 6, 5\).*onnxruntime.* \[5, 5\]"
    ):
        autofusion.compile(model)


def test_maxpool_pads_never_win(onnx_model, onnx_equal, rng) -> None:
    # The pad is -inf: on all-negative data a window over the pad still gives its largest element.
    x = -rng.uniform(1, 5, (1, 2, 5, 5)).astype(f32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 0, 0]}
    model = onnx_model([N("MaxPool", ["x"], ["y"], **attrs)], [("x", f32, x.shape)], [("y", f32, None)])
    out = onnx_equal(model, x)(x)
    assert bool(torch.all(out < 0))
    # Windows of -inf only: -inf (as onnx.reference; onnxruntime gives -FLT_MAX for some of them).
    x = np.full((1, 2, 5, 5), -np.inf, dtype=f32)
    out = autofusion.compile(model)(x)
    assert bool(torch.all(out == -torch.inf))


# -- Dropout --
@pytest.mark.parametrize(("version", "dt"), [(7, f32), (7, f16), (9, f32), (10, f32), (12, f32), (13, f16)])
def test_dropout_with_its_mask(onnx_model, ort_run, rng, generated_code_ran, version: int, dt) -> None:
    # The mask is the input's type below opset 10, bool from 10. onnxruntime's kernels for opsets 7-11
    # fill it with zeros; the spec (and onnx.reference) say every element is kept: all true.
    mask_type = dt if version < 10 else np.bool_
    ins: list[str] = ["x"]
    inits: dict[str, np.ndarray] = {}
    attrs = {"ratio": 0.3} if version < 12 else {}
    if version >= 12:
        ins += ["ratio", "training"]
        inits = {"ratio": np.asarray(0.3, dtype=f32), "training": np.asarray(False)}
    nodes = [N("Dropout", ins, ["d", "mask"], **attrs), N("Relu", ["d"], ["y"])]
    model = onnx_model(
        nodes, [("x", dt, [3, 4])], [("y", dt, [3, 4]), ("mask", mask_type, [3, 4])], inits, opset=version
    )
    x = rng.standard_normal((3, 4)).astype(dt)
    cm = autofusion.compile(model)
    y, mask = cm(x)
    generated_code_ran(cm.stats, "Dropout")
    _lowered(cm, "Dropout")
    ref_y = ort_run(model, [x])[0]
    torch.testing.assert_close(y, torch.from_numpy(ref_y))
    assert mask.dtype == torch.from_numpy(np.zeros(1, mask_type)).dtype
    assert bool(torch.all(mask == 1)), mask


def test_dropout_in_training_mode_is_refused(onnx_model) -> None:
    node = N("Dropout", ["x", "", "training"], ["y", "mask"], name="drop")
    model = onnx_model(
        [node], [("x", f32, [3])], [("y", f32, [3]), ("mask", np.bool_, [3])], {"training": np.asarray(True)}
    )
    with pytest.raises(FrontendError, match=r"'drop' \(Dropout, opset \d+\).*training_mode=true is random"):
        autofusion.compile(model)


# -- BatchNormalization, old style --
def _bn_inits(rng: np.random.Generator, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {
        "s": rng.uniform(0.5, 1.5, shape).astype(f32),
        "b": rng.standard_normal(shape).astype(f32),
        "m": rng.standard_normal(shape).astype(f32),
        "v": rng.uniform(0.5, 2.0, shape).astype(f32),
    }


@pytest.mark.parametrize(("version", "spatial"), [(7, 1), (7, 0), (8, 0), (9, None)])
def test_old_batch_norm(onnx_model, onnx_equal, rng, version: int, spatial: int | None) -> None:
    shape = (2, 3, 4, 5)
    attrs = {"epsilon": 1e-3, "momentum": 0.9} | ({} if spatial is None else {"spatial": spatial})
    stats = (3,) if spatial != 0 else shape[1:]
    node = N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], **attrs)
    model = onnx_model([node], [("x", f32, shape)], [("y", f32, shape)], _bn_inits(rng, stats), opset=version)
    cm = onnx_equal(model, rng.standard_normal(shape).astype(f32))
    assert cm.stats["lowered"].get("onnx.BatchNormalization") == 1


@pytest.mark.parametrize(
    ("version", "attrs"),
    [
        (6, {"is_test": 1}),
        (1, {"is_test": 1, "consumed_inputs": [0, 0, 0, 1, 1]}),
        (6, {"is_test": 1, "spatial": 0}),
    ],
)
def test_batch_norm_before_opset_7(onnx_model, rng, version: int, attrs: dict) -> None:
    # onnxruntime has no kernel below opset 7: the reference is the formula.
    shape = (2, 3, 4)
    per_activation = attrs.get("spatial") == 0
    p = _bn_inits(rng, shape[1:] if per_activation else (3,))
    node = N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-4, **attrs)
    # Opset 1-3 models are IR 3: the initializers are graph inputs too.
    ins = [("x", f32, shape)] + [(k, f32, v.shape) for k, v in p.items()]
    model = onnx_model([node], ins, [("y", f32, shape)], p, opset=version)
    x = rng.standard_normal(shape).astype(f32)
    want = {k: (v if per_activation else v.reshape(3, 1)) for k, v in p.items()}
    ref = (x - want["m"]) / np.sqrt(want["v"] + 1e-4) * want["s"] + want["b"]
    out = autofusion.compile(model)(x)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_batch_norm_training_mode_before_opset_7_is_refused(onnx_model, rng) -> None:
    node = N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn1")  # is_test=0 by default
    model = onnx_model([node], [("x", f32, [2, 3])], [("y", f32, [2, 3])], _bn_inits(rng, (3,)), opset=6)
    with pytest.raises(ModelFileError, match=r"'bn1' \(BatchNormalization, opset 6\): is_test=0 is training"):
        autofusion.compile(model)


# -- Upsample and Resize-10 (asymmetric sampling) --
UPSAMPLES = [
    (v, mode, s)
    for v in (7, 9, 10)
    for mode in ("nearest", "linear")
    for s in ([1, 1, 2, 2], [1, 1, 1.5, 2.5])
]
UPSAMPLES += [
    (10, "nearest", [1, 1, 1.7, 0.6]),
    (10, "linear", [1, 1, 0.5, 1.0]),
    (10, "nearest", [1, 1, 0.6, 0.5]),
]


@pytest.mark.parametrize(("version", "mode", "scales"), UPSAMPLES)
def test_upsample_and_resize10(
    onnx_model, onnx_equal, rng, version: int, mode: str, scales: list[float]
) -> None:
    shape = (1, 2, 5, 4)
    out = [int(np.floor(d * s)) for d, s in zip(shape, scales, strict=True)]
    s = np.asarray(scales, dtype=f32)
    if version < 9:
        node = N("Upsample", ["x"], ["y"], mode=mode, scales=[float(v) for v in scales])
        inits = {}
    else:
        node = N("Upsample" if version == 9 else "Resize", ["x", "s"], ["y"], mode=mode)
        inits = {"s": s}
    model = onnx_model([node], [("x", f32, shape)], [("y", f32, out)], inits, opset=version)
    _lowered(onnx_equal(model, rng.standard_normal(shape).astype(f32)), "Resize")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_fp16(onnx_model, ort_run, rng, generated_code_ran, mode: str) -> None:
    shape, out = (1, 3, 4, 5), [1, 3, 8, 15]
    node = N("Upsample", ["x", "s"], ["y"], mode=mode)
    inits = {"s": np.asarray([1, 1, 2, 3], dtype=f32)}
    model16 = onnx_model([node], [("x", f16, shape)], [("y", f16, out)], inits, opset=9)
    model32 = onnx_model([node], [("x", f32, shape)], [("y", f32, out)], inits, opset=9)
    x = rng.standard_normal(shape).astype(f16)
    cm = autofusion.compile(model16)
    got = cm(x)
    generated_code_ran(cm.stats, "Upsample fp16")
    (ref,) = ort_run(model32, [x.astype(f32)])
    torch.testing.assert_close(got, torch.from_numpy(ref.astype(f16)), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("nearest_mode", ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"])
def test_resize_asymmetric_nearest_modes(onnx_model, onnx_equal, rng, nearest_mode: str) -> None:
    node = N(
        "Resize",
        ["x", "", "", "sizes"],
        ["y"],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode=nearest_mode,
    )
    sizes = np.asarray([2, 3, 7, 3], dtype=np.int64)
    model = onnx_model(
        [node], [("x", f32, (2, 3, 4, 5))], [("y", f32, sizes.tolist())], {"sizes": sizes}, opset=13
    )
    _lowered(onnx_equal(model, rng.standard_normal((2, 3, 4, 5)).astype(f32)), "Resize")


def test_resize_asymmetric_nearest_of_uint8(onnx_model, onnx_equal, rng) -> None:
    node = N(
        "Resize", ["x", "", "scales"], ["y"], mode="nearest", coordinate_transformation_mode="asymmetric"
    )
    scales = np.asarray([1, 1, 2.5, 0.5], dtype=f32)
    x = rng.integers(0, 255, (1, 3, 4, 6), endpoint=True).astype(np.uint8)
    model = onnx_model([node], [("x", np.uint8, x.shape)], [("y", np.uint8, None)], {"scales": scales})
    _lowered(onnx_equal(model, x), "Resize")


# -- a classic CNN at each old opset --
def _classic_cnn(onnx_model, version: int, rng: np.random.Generator) -> onnx.ModelProto:
    """conv -> relu -> LRN -> maxpool (asymmetric pads) -> dropout (mask read) -> BN -> upsample ->
    conv -> global average pool -> flatten -> gemm, written the way exporters of that opset wrote it."""
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(f32)  # noqa: E731
    inits = {"w1": w(8, 3, 3, 3), "b1": w(8), "w2": w(6, 8, 3, 3), "fc": w(4, 6), "fcb": w(4)}
    inits |= {k: v.reshape(8) for k, v in _bn_inits(rng, (8,)).items()}
    bn_attrs = {"epsilon": 1e-5} | ({"spatial": 1} if version < 9 else {})
    drop_attrs = {"ratio": 0.5} if version < 12 else {}
    mask_type = f32 if version < 10 else np.bool_
    nodes = [
        N("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        N("Relu", ["c1"], ["r1"]),
        N("LRN", ["r1"], ["n1"], size=5, alpha=1e-3, beta=0.75, bias=2.0),
        N("MaxPool", ["n1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
        N("Dropout", ["p1"], ["d1", "mask"], **drop_attrs),
        N("BatchNormalization", ["d1", "s", "b", "m", "v"], ["bn"], **bn_attrs),
    ]
    if version < 9:
        nodes.append(N("Upsample", ["bn"], ["u"], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]))
    elif version == 9:
        inits["sc"] = np.asarray([1, 1, 2, 2], dtype=f32)
        nodes.append(N("Upsample", ["bn", "sc"], ["u"], mode="linear"))
    elif version == 10:
        inits["sc"] = np.asarray([1, 1, 2, 2], dtype=f32)
        nodes.append(N("Resize", ["bn", "sc"], ["u"], mode="linear"))
    else:
        inits["sc"] = np.asarray([1, 1, 2, 2], dtype=f32)
        inits["roi"] = np.zeros(0, dtype=f32)
        nodes.append(
            N(
                "Resize",
                ["bn", "roi", "sc"],
                ["u"],
                mode="linear",
                coordinate_transformation_mode="asymmetric",
            )
        )
    nodes += [
        N("Conv", ["u", "w2"], ["c2"], kernel_shape=[3, 3]),
        N("AveragePool", ["c2"], ["a2"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]),
        N("GlobalAveragePool", ["a2"], ["g"]),
        N("Flatten", ["g"], ["f"], axis=1),
        N("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    outs = [("y", f32, [2, 4]), ("mask", mask_type, [2, 8, 5, 5])]
    return onnx_model(nodes, [("x", f32, [2, 3, 11, 11])], outs, inits, opset=version)


@pytest.mark.parametrize("version", [7, 9, 10, 11, 12])
def test_classic_cnn(onnx_model, ort_run, rng, generated_code_ran, version: int, caplog) -> None:
    model = _classic_cnn(onnx_model, version, rng)
    onnx.checker.check_model(model, full_check=True)
    x = rng.standard_normal((2, 3, 11, 11)).astype(f32)
    with caplog.at_level(logging.INFO, logger="autofusion.frontend"):
        cm = autofusion.compile(model)
        y, mask = cm(x)
    assert f"converted from opset {version} to opset 13" in caplog.text
    generated_code_ran(cm.stats, f"classic CNN opset {version}", expect_kernel=True)
    for op in ("LRN", "MaxPool", "Dropout", "BatchNormalization", "Resize", "AveragePool", "Flatten"):
        _lowered(cm, op)
    ref_y, _ = ort_run(model, [x])  # onnxruntime's old Dropout kernels give a zero mask; the spec: ones
    torch.testing.assert_close(y, torch.from_numpy(ref_y), rtol=1e-4, atol=1e-5)
    assert bool(torch.all(mask == 1))


def test_nodes_in_subgraphs_are_read_at_their_opset_too(onnx_model, ort_run, rng) -> None:
    # An If whose branches upsample ('linear'): the loaded (converted) model must compute what the
    # opset-9 model computes; onnxruntime runs both.
    from autofusion.frontend.onnx.loader import load_model

    def branch(name: str, scale: float) -> onnx.GraphProto:
        s = helper.make_tensor(f"s_{name}", onnx.TensorProto.FLOAT, [4], [1, 1, scale, scale])
        up = N("Upsample", ["x", f"s_{name}"], [f"y_{name}"], mode="linear")
        out = helper.make_tensor_value_info(f"y_{name}", onnx.TensorProto.FLOAT, [1, 2, 6, 6])
        return helper.make_graph([up], name, [], [out], initializer=[s])

    node = N("If", ["c"], ["y"], then_branch=branch("then", 2.0), else_branch=branch("else", 2.0))
    model = onnx_model(
        [node], [("c", np.bool_, []), ("x", f32, [1, 2, 3, 3])], [("y", f32, [1, 2, 6, 6])], opset=9
    )
    loaded, _ = load_model(model)
    kinds = [(n.op_type, n.attribute) for n in loaded.graph.node[0].attribute[0].g.node]
    assert [k for k, _ in kinds] == ["Resize"]
    assert (
        helper.get_attribute_value(next(a for a in kinds[0][1] if a.name == "coordinate_transformation_mode"))
        == b"asymmetric"
    )
    x = rng.standard_normal((1, 2, 3, 3)).astype(f32)
    for c in (True, False):
        want, got = ort_run(model, [np.asarray(c), x]), ort_run(loaded, [np.asarray(c), x])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
