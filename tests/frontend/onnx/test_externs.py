"""The ONNX ops that run as torch externs (frontend/onnx/externs/), each against onnxruntime.

One node per model, fp32 and fp16, odd shapes, every attribute the ONNX spec gives the op (the
backend node cases' variants among them). Each test also checks the node really ran as the extern
(one extern call, the composite target), or, for the ops that are now IR converters, that no extern
was left. Shape-like inputs (sizes, scales, K, ...) are initializers: known at import.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import helper

from autofusion.errors import FrontendError

N = helper.make_node
f32, f16, i64 = np.float32, np.float16, np.int64


def _run(onnx_model, onnx_equal, node, inputs, inits=None, n_out=1, opset=22, externs=1, out_dtypes=None):
    """Builds the one-node model, checks it against onnxruntime, and counts its extern calls."""
    names = [n for n in node.output]
    dts = out_dtypes or [inputs[0][1]] * n_out
    outs = [(names[k], dts[k], None) for k in range(n_out)]
    model = onnx_model([node], [(n, dt, a.shape) for n, dt, a in inputs], outs, inits or {}, opset=opset)
    cm = onnx_equal(model, *[a for _, _, a in inputs])
    assert cm.stats["extern_calls"] == externs, cm.stats
    return cm


def _x(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# ---- Resize ----------------------------------------------------------------------------------------

_RESIZE = [
    # (attributes, scales or None, sizes or None, roi or None)
    ({"mode": "nearest"}, [1, 1, 2.0, 1.5], None, None),
    ({"mode": "nearest"}, [1, 1, 0.6, 0.8], None, None),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "asymmetric"},
     None, [1, 3, 9, 4], None),
    ({"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "align_corners"},
     None, [1, 3, 8, 11], None),
    ({"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "half_pixel"},
     None, [1, 3, 3, 13], None),
    ({"mode": "linear"}, [1, 1, 2.0, 0.5], None, None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [1, 3, 9, 3], None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None, [1, 3, 1, 12], None),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 1.7, 2.3], None, None),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 0.7, 1.3], None,
     None),
    ({"mode": "linear", "antialias": 1}, None, [1, 3, 2, 3], None),
    ({"mode": "cubic"}, [1, 1, 1.6, 2.0], None, None),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, [1, 1, 0.8, 1.4], None, None),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, None, [1, 3, 7, 9], None),
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.5, 0.4], None, None),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 7.0},
     None, [1, 3, 6, 6], [0, 0, 0.2, -0.25, 1, 1, 0.9, 1.2]),
    ({"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"}, None, [1, 3, 4, 9],
     [0, 0, 0.1, 0.25, 1, 1, 0.7, 1.1]),
    ({"mode": "cubic", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -1.0},
     [1, 1, 1.5, 0.9], None, [0, 0, -0.2, 0.05, 1, 1, 0.8, 0.95]),
    ({"mode": "nearest", "axes": [3, 2]}, [3.0, 0.5], None, None),
    ({"mode": "linear", "axes": [3], "keep_aspect_ratio_policy": "not_larger"}, None, [5], None),
    ({"mode": "nearest", "axes": [-1, -2]}, None, [4, 9], None),
    ({"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}, None, [3, 20], None),
    ({"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, None, [3, 20], None),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    ("attrs", "scales", "sizes", "roi"), _RESIZE, ids=[str(k) for k in range(len(_RESIZE))]
)
def test_resize(onnx_model, onnx_equal, rng, attrs, scales, sizes, roi, dtype) -> None:
    inits = {"roi": np.array(roi or [], f32), "scales": np.array(scales or [], f32)}
    ins = ["x", "roi", "scales"]
    if sizes is not None:
        inits["sizes"] = np.array(sizes, i64)
        ins.append("sizes")
    node = N("Resize", ins, ["y"], **attrs)
    # Asymmetric coordinates without axes or aspect policies convert to index selects (and weights) in
    # the IR, which fuse (converters/classic.py); every other form runs as the extern.
    fused = attrs.get("coordinate_transformation_mode") == "asymmetric"
    x = _x(rng, (1, 3, 5, 7), dtype)
    _run(onnx_model, onnx_equal, node, [("x", dtype, x)], inits, opset=19, externs=0 if fused else 1)


def test_resize_int_nearest_and_3d(onnx_model, onnx_equal, rng) -> None:
    x = rng.integers(-50, 50, (2, 2, 3, 4, 5)).astype(np.int32)
    node = N("Resize", ["x", "", "s"], ["y"], mode="nearest")
    _run(
        onnx_model,
        onnx_equal,
        node,
        [("x", np.int32, x)],
        {"s": np.array([1, 1, 1.5, 2, 0.6], f32)},
        opset=19,
    )
    node = N("Resize", ["x", "", "s"], ["y"], mode="linear")
    y = _x(rng, (2, 2, 3, 4, 5), f32)
    _run(onnx_model, onnx_equal, node, [("x", f32, y)], {"s": np.array([1, 1, 1.5, 2, 0.6], f32)}, opset=19)


def test_resize_linear_of_ints_is_refused(onnx_model, rng) -> None:
    import autofusion

    node = N("Resize", ["x", "", "s"], ["y"], mode="linear")
    model = onnx_model([node], [("x", np.int32, [1, 1, 2, 2])], [("y", np.int32, None)],
                       {"s": np.array([1, 1, 2, 2], f32)}, opset=19)  # fmt: skip
    with pytest.raises(FrontendError, match="linear Resize of int32"):
        autofusion.compile(model)


# ---- pooling ---------------------------------------------------------------------------------------

_POOL = [
    {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]},
    {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0], "strides": [2, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 0, 1, 1]},
    {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1]},
    # pads ATen takes itself (the same at both ends, at most half the window; no ceil overflow):
    {"kernel_shape": [3, 2], "pads": [1, 1, 1, 1], "strides": [2, 1]},
    {"kernel_shape": [3, 3], "pads": [2, 1, 2, 1], "dilations": [2, 1]},
]


@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("attrs", _POOL, ids=[str(k) for k in range(len(_POOL))])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "AveragePool-include", "LpPool"])
def test_pool(onnx_model, onnx_equal, rng, op, attrs, dtype) -> None:
    attrs = dict(attrs)
    if op == "AveragePool-include":
        op, attrs["count_include_pad"] = "AveragePool", 1
    if op == "LpPool":
        attrs["p"] = 3
    x = _x(rng, (2, 3, 7, 8), dtype)
    _run(onnx_model, onnx_equal, N(op, ["x"], ["y"], **attrs), [("x", dtype, x)])


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attrs", [_POOL[k] for k in (0, 3, 4, 6, 7, 8)], ids=["0", "3", "4", "6", "7", "8"])
def test_max_pool_indices(onnx_model, onnx_equal, rng, attrs, storage_order) -> None:
    x = _x(rng, (2, 3, 7, 8), f32)
    node = N("MaxPool", ["x"], ["y", "i"], storage_order=storage_order, **attrs)
    _run(onnx_model, onnx_equal, node, [("x", f32, x)], n_out=2, out_dtypes=[f32, i64])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pool_1d_and_3d(onnx_model, onnx_equal, rng, op) -> None:
    node = N(op, ["x"], ["y"], kernel_shape=[3], pads=[1, 2], strides=[2], ceil_mode=1, dilations=[2])
    _run(onnx_model, onnx_equal, node, [("x", f32, _x(rng, (2, 3, 10), f32))])
    # (SAME with dilations: onnxruntime sizes the pads without the dilation, against the spec and ONNX
    # shape inference, which autofusion follows; so not combined here.)
    node = N(op, ["x"], ["y"], kernel_shape=[2, 3, 2], auto_pad="SAME_UPPER", strides=[1, 2, 1])
    _run(onnx_model, onnx_equal, node, [("x", f32, _x(rng, (1, 2, 4, 5, 6), f32))])


def test_max_unpool(onnx_model, onnx_equal, rng) -> None:
    x = _x(rng, (2, 3, 6, 8), f32)
    pool = N("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = N("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    model = onnx_model([pool, unpool], [("x", f32, x.shape)], [("y", f32, None)], opset=22)
    cm = onnx_equal(model, x)
    assert cm.stats["extern_calls"] == 2


# ---- GridSample / AffineGrid -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample(onnx_model, onnx_equal, rng, mode, padding, align, dtype) -> None:
    x = _x(rng, (2, 3, 5, 6), dtype)
    grid = (1.3 * rng.uniform(-1, 1, (2, 4, 7, 2))).astype(dtype)
    node = N("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    _run(onnx_model, onnx_equal, node, [("x", dtype, x), ("g", dtype, grid)])


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_5d(onnx_model, onnx_equal, rng, mode) -> None:
    x = _x(rng, (1, 2, 3, 4, 5), f32)
    grid = (1.2 * rng.uniform(-1, 1, (1, 2, 3, 4, 3))).astype(f32)
    node = N("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode="border")
    _run(onnx_model, onnx_equal, node, [("x", f32, x), ("g", f32, grid)])


def test_grid_sample_opset16_names(onnx_model, onnx_equal, rng) -> None:
    x, grid = _x(rng, (1, 2, 4, 4), f32), rng.uniform(-1, 1, (1, 3, 3, 2)).astype(f32)
    node = N("GridSample", ["x", "g"], ["y"], mode="bicubic")
    _run(onnx_model, onnx_equal, node, [("x", f32, x), ("g", f32, grid)], opset=16)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 3, 2, 4, 5]])
def test_affine_grid(onnx_model, onnx_equal, rng, size, align) -> None:
    theta = _x(rng, (2, len(size) - 2, len(size) - 1), f32)
    node = N("AffineGrid", ["t", "s"], ["y"], align_corners=align)
    _run(onnx_model, onnx_equal, node, [("t", f32, theta)], {"s": np.array(size, i64)})


# ---- scatter / gather ------------------------------------------------------------------------------


# onnxruntime's ScatterND reduces no fp16 and its ScatterElements adds or multiplies none: fp32 there.
_SCATTER = [(r, f32) for r in ("none", "add", "mul", "max", "min")]


@pytest.mark.parametrize(("reduction", "dtype"), [*_SCATTER, ("none", f16)])
def test_scatter_nd(onnx_model, onnx_equal, rng, reduction, dtype) -> None:
    data = _x(rng, (4, 3, 5), dtype)
    idx = np.array([[[1, 2]], [[-1, 0]], [[1, 2]] if reduction != "none" else [[0, 0]]], i64)  # [3, 1, 2]
    upd = _x(rng, (3, 1, 5), dtype)
    node = N("ScatterND", ["d", "i", "u"], ["y"], reduction=reduction)
    _run(onnx_model, onnx_equal, node, [("d", dtype, data), ("u", dtype, upd)], {"i": idx}, opset=18)


def test_scatter_nd_indices_as_input(onnx_model, onnx_equal, rng) -> None:
    data, upd = _x(rng, (4, 3), f32), _x(rng, (2,), f32)
    node = N("ScatterND", ["d", "i", "u"], ["y"])
    ins = [("d", f32, data), ("i", i64, np.array([[3, 2], [0, -3]], i64)), ("u", f32, upd)]
    _run(onnx_model, onnx_equal, node, ins, opset=18)


@pytest.mark.parametrize(("reduction", "dtype"), [*_SCATTER, ("none", f16), ("max", f16), ("min", f16)])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements(onnx_model, onnx_equal, rng, axis, reduction, dtype) -> None:
    data = _x(rng, (4, 5), dtype)
    idx = np.array([[1, -1, 3], [0, 2, 0]] if reduction == "none" else [[1, -1, 1], [0, 2, 0]], i64)
    node = N("ScatterElements", ["d", "i", "u"], ["y"], axis=axis, reduction=reduction)
    ins = [("d", dtype, data), ("i", i64, idx), ("u", dtype, _x(rng, (2, 3), dtype))]
    _run(onnx_model, onnx_equal, node, ins, opset=18)


@pytest.mark.parametrize(("shape", "idx", "batch_dims"), [
    ((3, 4, 5), [[1, -2], [0, 3]], 0),
    ((3, 4, 5), [[[2]], [[0]]], 0),
    ((2, 4, 5), [[[1, 2]], [[3, -1]]], 1),
    ((2, 3, 4, 5), [[[1], [2], [0]], [[0], [-1], [3]]], 2),
])  # fmt: skip
def test_gather_nd(onnx_model, onnx_equal, rng, shape, idx, batch_dims) -> None:
    node = N("GatherND", ["d", "i"], ["y"], batch_dims=batch_dims)
    ins = [("d", f32, _x(rng, shape, f32)), ("i", i64, np.array(idx, i64))]
    _run(onnx_model, onnx_equal, node, ins)


@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(onnx_model, onnx_equal, rng, mode, dtype) -> None:
    cache, upd = _x(rng, (2, 3, 6, 4), dtype), _x(rng, (2, 3, 2, 4), dtype)
    write = np.array([1, 5] if mode == "circular" else [1, 4], i64)
    node = N("TensorScatter", ["c", "u", "w"], ["y"], mode=mode)
    ins = [("c", dtype, cache), ("u", dtype, upd), ("w", i64, write)]
    _run(onnx_model, onnx_equal, node, ins, opset=24)
    node = N("TensorScatter", ["c", "u"], ["y"], axis=1)
    _run(
        onnx_model,
        onnx_equal,
        node,
        [("c", dtype, cache), ("u", dtype, _x(rng, (2, 1, 6, 4), dtype))],
        opset=24,
    )


# ---- TopK and the rest -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(("axis", "largest"), [(-1, 1), (0, 0), (1, 1)])
def test_top_k_with_ties(onnx_model, onnx_equal, rng, axis, largest, dtype) -> None:
    x = rng.integers(0, 4, (5, 6, 7)).astype(dtype)  # many ties: ONNX orders them by index
    node = N("TopK", ["x", "k"], ["y", "i"], axis=axis, largest=largest)
    _run(onnx_model, onnx_equal, node, [("x", dtype, x)], {"k": np.array([3], i64)}, n_out=2,
         out_dtypes=[dtype, i64])  # fmt: skip


@pytest.mark.parametrize(("time_axis", "batch_axis"), [(0, 1), (1, 0)])
def test_reverse_sequence(onnx_model, onnx_equal, rng, time_axis, batch_axis) -> None:
    shape = [0, 0, 3]
    shape[time_axis], shape[batch_axis] = 5, 4
    node = N("ReverseSequence", ["x", "l"], ["y"], time_axis=time_axis, batch_axis=batch_axis)
    ins = [("x", f32, _x(rng, tuple(shape), f32)), ("l", i64, np.array([1, 5, 3, 2], i64))]
    _run(onnx_model, onnx_equal, node, ins)


@pytest.mark.parametrize(("image", "block", "attrs"), [
    ([5, 5], [2, 3], {}),
    ([6, 7], [3, 2], {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    ([3, 4, 5], [2, 2, 2], {"strides": [1, 2, 1]}),
])  # fmt: skip
@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
def test_col2im(onnx_model, onnx_equal, rng, image, block, attrs, dtype) -> None:
    n = len(image)
    pads = attrs.get("pads", [0] * 2 * n)
    st, dil = attrs.get("strides", [1] * n), attrs.get("dilations", [1] * n)
    count = [(i + pads[d] + pads[n + d] - dil[d] * (b - 1) - 1) // st[d] + 1
             for d, (i, b) in enumerate(zip(image, block, strict=True))]  # fmt: skip
    x = _x(rng, (2, 3 * int(np.prod(block)), int(np.prod(count))), dtype)
    node = N("Col2Im", ["x", "img", "blk"], ["y"], **attrs)
    _run(
        onnx_model,
        onnx_equal,
        node,
        [("x", dtype, x)],
        {"img": np.array(image, i64), "blk": np.array(block, i64)},
    )


@pytest.mark.parametrize("attrs", [
    {"output_shape": [10, 8], "strides": [3, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 3], "dilations": [2, 1]},
    {"pads": [1, 0, 2, 1], "strides": [2, 2], "output_padding": [1, 1]},
    {"output_shape": [9, 10], "strides": [2, 2], "group": 3},
])  # fmt: skip
@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
def test_conv_transpose_shapes(onnx_model, onnx_equal, rng, attrs, dtype) -> None:
    w = _x(rng, (3, 2 if attrs.get("group") else 4, 3, 3), dtype)
    ins = [
        ("x", dtype, _x(rng, (2, 3, 4, 5), dtype)),
        ("w", dtype, w),
        ("b", dtype, _x(rng, (w.shape[1] * attrs.get("group", 1),), dtype)),
    ]
    _run(onnx_model, onnx_equal, N("ConvTranspose", ["x", "w", "b"], ["y"], **attrs), ins)


@pytest.mark.parametrize(("attrs", "with_mask", "with_bias"), [
    ({}, False, False),
    ({"pads": [1, 2, 0, 1], "strides": [2, 1], "dilations": [1, 2]}, True, True),
    ({"group": 2, "offset_group": 2}, True, False),
])  # fmt: skip
@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
def test_deform_conv(onnx_model, onnx_equal, rng, attrs, with_mask, with_bias, dtype) -> None:
    c, oc, kh, kw, ih, iw = 4, 6, 2, 3, 5, 6
    g, og = attrs.get("group", 1), attrs.get("offset_group", 1)
    pads = attrs.get("pads", [0, 0, 0, 0])
    st, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    oh = (ih + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // st[0] + 1
    ow = (iw + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // st[1] + 1
    ins = [("x", dtype, _x(rng, (2, c, ih, iw), dtype)), ("w", dtype, _x(rng, (oc, c // g, kh, kw), dtype)),
           ("o", dtype, (1.5 * _x(rng, (2, og * 2 * kh * kw, oh, ow), f32)).astype(dtype))]  # fmt: skip
    names = ["x", "w", "o"]
    if with_bias or with_mask:
        names.append("b" if with_bias else "")
        if with_bias:
            ins.append(("b", dtype, _x(rng, (oc,), dtype)))
    if with_mask:
        names.append("m")
        ins.append(("m", dtype, rng.uniform(0, 1, (2, og * kh * kw, oh, ow)).astype(dtype)))
    node = N("DeformConv", names, ["y"], kernel_shape=[kh, kw], **attrs)
    _run(onnx_model, onnx_equal, node, ins)


# ---- converters: DepthToSpace, SpaceToDepth, CenterCropPad (IR views: no extern) -------------------


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(onnx_model, onnx_equal, rng, mode) -> None:
    x = _x(rng, (2, 12, 3, 5), f32)
    _run(onnx_model, onnx_equal, N("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode), [("x", f32, x)],
         externs=0)  # fmt: skip
    x = _x(rng, (2, 3, 6, 4), f16)
    # SpaceToDepth names its channel order from opset 28 on (onnxruntime: DCR before it).
    _run(onnx_model, onnx_equal, N("SpaceToDepth", ["x"], ["y"], blocksize=2), [("x", f16, x)], externs=0)


@pytest.mark.parametrize(("shape", "axes"), [([4, 9, 3], None), ([7, 2], [0, 1]), ([5, 6], [-3, -2])])
def test_center_crop_pad(onnx_model, onnx_equal, rng, shape, axes) -> None:
    x = _x(rng, (6, 5, 3), f32)
    attrs = {} if axes is None else {"axes": axes}
    node = N("CenterCropPad", ["x", "s"], ["y"], **attrs)
    _run(onnx_model, onnx_equal, node, [("x", f32, x)], {"s": np.array(shape, i64)}, externs=0, opset=18)


def test_unique_is_refused_with_its_reason(onnx_model) -> None:
    import autofusion

    model = onnx_model([N("Unique", ["x"], ["y"])], [("x", f32, [6])], [("y", f32, [None])])
    with pytest.raises(FrontendError, match="depends on the input's values"):
        autofusion.compile(model)


@pytest.mark.parametrize(("op", "opset", "mode", "scales"), [
    ("Upsample", 9, "nearest", [1, 1, 1.5, 3]),
    ("Upsample", 9, "linear", [1, 1, 2, 1.5]),
    ("Resize", 10, "nearest", [1, 1, 0.6, 2]),
    ("Resize", 10, "linear", [1, 1, 1.5, 0.5]),
])  # fmt: skip
def test_old_resize_forms(onnx_model, onnx_equal, rng, monkeypatch, op, opset, mode, scales) -> None:
    # Opset 9/10's (X, scales) forms, asymmetric coordinates and onnxruntime's nearest rounding
    # for them (floor up, ceil down); the loader's opset floor is lowered to let them through as they are.
    from autofusion.frontend.onnx import loader

    monkeypatch.setattr(loader, "MIN_OPSET", 9)
    node = N(op, ["x", "s"], ["y"], mode=mode)
    x = _x(rng, (1, 2, 5, 4), f32)
    model = onnx_model([node], [("x", f32, x.shape)], [("y", f32, None)], {"s": np.array(scales, f32)},
                       opset=opset)  # fmt: skip
    cm = onnx_equal(model, x)
    assert cm.stats["extern_calls"] == 0  # asymmetric coordinates: index selects in the IR


def test_max_pool_int8(onnx_model, onnx_equal, rng) -> None:
    x = rng.integers(-128, 127, (1, 2, 5, 6)).astype(np.int8)
    for pads in ([1, 0, 0, 1], [1, 1, 1, 1]):
        node = N("MaxPool", ["x"], ["y"], kernel_shape=[2, 3], pads=pads)
        _run(onnx_model, onnx_equal, node, [("x", np.int8, x)])


@pytest.mark.parametrize(("xs", "ws", "attrs"), [
    ((2, 3, 7), (3, 2, 4), {"output_shape": [16], "strides": [2]}),
    ((1, 2, 3, 4, 3), (2, 3, 2, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 1, 3]}),
    ((1, 2, 3, 4, 3), (2, 3, 2, 3, 2),
     {"pads": [0, 1, 1, 1, 0, 0], "output_padding": [1, 0, 0], "strides": [2, 2, 1]}),
])  # fmt: skip
def test_conv_transpose_1d_3d(onnx_model, onnx_equal, rng, xs, ws, attrs) -> None:
    ins = [("x", f32, _x(rng, xs, f32)), ("w", f32, _x(rng, ws, f32))]
    _run(onnx_model, onnx_equal, N("ConvTranspose", ["x", "w"], ["y"], **attrs), ins)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_scatter_gather_of_other_types(onnx_model, onnx_equal, rng, dtype) -> None:
    data = rng.integers(0, 2 if dtype is np.bool_ else 100, (4, 3)).astype(dtype)
    upd = rng.integers(0, 2 if dtype is np.bool_ else 100, (2, 3)).astype(dtype)
    idx = np.array([[3], [-4]], i64)
    node = N("ScatterND", ["d", "i", "u"], ["y"])
    _run(onnx_model, onnx_equal, node, [("d", dtype, data), ("u", dtype, upd)], {"i": idx})
    node = N("GatherND", ["d", "i"], ["y"])
    _run(onnx_model, onnx_equal, node, [("d", dtype, data)], {"i": np.array([[1, 2], [-1, 0]], i64)})


@pytest.mark.parametrize(("coord", "nearest_mode", "scales", "externs"), [
    ("asymmetric", "floor", [1, 1, 2, 2], 0),
    ("half_pixel", "round_prefer_floor", [1, 1, 3, 1], 0),
    ("half_pixel", "round_prefer_ceil", [1, 1, 2, 4], 0),
    ("align_corners", "round_prefer_floor", [1, 1, 2, 2], 0),  # 5 -> 10 corners to corners: a repeat too
    ("asymmetric", "round_prefer_ceil", [1, 1, 2, 2], 0),  # 0, 1, 1, 2, 2, ...: not a repeat, index selects
])  # fmt: skip
@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
def test_resize_by_whole_factors_fuses(
    onnx_model, onnx_equal, rng, coord, nearest_mode, scales, externs, dtype
):
    nodes = [
        N("Resize", ["x", "", "s"], ["r"], mode="nearest", coordinate_transformation_mode=coord,
          nearest_mode=nearest_mode),
        N("Relu", ["r"], ["y"]),
    ]  # fmt: skip
    x = _x(rng, (2, 3, 5, 4), dtype)
    model = onnx_model(
        nodes, [("x", dtype, x.shape)], [("y", dtype, None)], {"s": np.array(scales, f32)}, opset=19
    )
    cm = onnx_equal(model, x)
    assert cm.stats["extern_calls"] == externs, cm.stats


@pytest.mark.parametrize(("op", "attrs", "shape"), [
    ("Resize", {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, (1, 1, 1, 4)),
    ("Resize", {"mode": "cubic"}, (2, 1, 1, 1)),
    ("MaxPool", {"kernel_shape": [1, 3], "pads": [0, 1, 0, 1]}, (1, 2, 1, 3)),
    ("AveragePool", {"kernel_shape": [2, 2], "ceil_mode": 1, "strides": [2, 2]}, (1, 1, 1, 1)),
    ("LpPool", {"kernel_shape": [1, 1]}, (3, 1, 2, 1)),
])  # fmt: skip
def test_size_one_dims(onnx_model, onnx_equal, rng, op, attrs, shape) -> None:
    if op == "Resize":
        node = N("Resize", ["x", "", "s"], ["y"], **attrs)
        inits = {"s": np.array([1, 1, 3, 2], f32)}
    else:
        node, inits = N(op, ["x"], ["y"], **attrs), {}
    _run(onnx_model, onnx_equal, node, [("x", f32, _x(rng, shape, f32))], inits, opset=19)


def test_resize_ignores_a_run_time_roi_it_does_not_use(onnx_model, onnx_equal, rng) -> None:
    node = N("Resize", ["x", "roi", "s"], ["y"], mode="linear")
    ins = [("x", f32, _x(rng, (1, 2, 3, 4), f32)), ("roi", f32, np.zeros(8, f32))]
    _run(onnx_model, onnx_equal, node, ins, {"s": np.array([1, 1, 2, 1.5], f32)}, opset=19)


def test_composite_externs_export_as_their_onnx_nodes(onnx_model, ort_run, rng) -> None:
    # An exported plan writes each composite extern back as the ONNX node it came from.
    import autofusion
    from autofusion.export.onnx import export_plan

    nodes = [
        N("Resize", ["x", "", "s"], ["r"], mode="cubic", exclude_outside=1),
        N("MaxPool", ["r"], ["p", "i"], kernel_shape=[3, 2], pads=[1, 0, 0, 1], storage_order=1),
        N("Relu", ["p"], ["y"]),
    ]
    model = onnx_model(nodes, [("x", f32, [1, 2, 5, 6])], [("y", f32, None), ("i", i64, None)],
                       {"s": np.array([1, 1, 1.5, 0.7], f32)}, opset=19)  # fmt: skip
    cm = autofusion.compile(model)
    assert cm.stats["extern_calls"] == 2
    exported = export_plan(cm.compiled.program.plan, opset=19)
    ops = [n.op_type for n in exported.graph.node]
    assert "Resize" in ops and "MaxPool" in ops
    x = _x(rng, (1, 2, 5, 6), f32)
    for got, want in zip(ort_run(exported, [x]), ort_run(model, [x]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("mode", "coord", "shape", "outs"), [
    ("linear", "half_pixel", (2, 3, 7), (12,)),
    ("linear", "align_corners", (1, 2, 5, 6), (9, 4)),
    ("linear", "pytorch_half_pixel", (1, 2, 3, 5, 6), (5, 2, 11)),
    ("cubic", "half_pixel", (1, 2, 5, 6), (3, 13)),
    ("cubic", "align_corners", (1, 2, 5, 6), (8, 8)),
])  # fmt: skip
def test_resize_aten_route_equals_the_taps(monkeypatch, rng, mode, coord, shape, outs) -> None:
    # Where ATen's upsample kernel runs, it gives what the per-axis taps give (its formula is ONNX's).
    import torch

    from autofusion.frontend.onnx.externs import resize as rz

    x = torch.from_numpy(_x(rng, shape, f32))
    specs = tuple((2 + k, shape[2 + k], o, o / shape[2 + k], 0.0, 1.0) for k, o in enumerate(outs))
    args = (specs, mode, "round_prefer_floor", coord, -0.75, False, 0.0, False)
    assert rz._aten_resize(x, *(args[i] for i in (0, 1, 3, 4, 5, 7))) is not None
    fast = rz.resize(x, *args)
    monkeypatch.setattr(rz, "_aten_resize", lambda *a: None)
    torch.testing.assert_close(fast, rz.resize(x, *args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.6, 1.7]])
def test_resize_opset11_tf_half_pixel_for_nn(onnx_model, onnx_equal, rng, monkeypatch, scales) -> None:
    from autofusion.frontend.onnx import loader

    monkeypatch.setattr(loader, "MIN_OPSET", 11)
    node = N(
        "Resize",
        ["x", "roi", "s"],
        ["y"],
        mode="nearest",
        coordinate_transformation_mode="tf_half_pixel_for_nn",
    )
    x = _x(rng, (1, 2, 5, 4), f32)
    inits = {"roi": np.zeros(0, f32), "s": np.array(scales, f32)}
    model = onnx_model([node], [("x", f32, x.shape)], [("y", f32, None)], inits, opset=11)
    onnx_equal(model, x)


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool", "LpPool"])
@pytest.mark.parametrize("include", [0, 1])
def test_a_window_longer_than_the_input_is_cut_not_padded(onnx_model, onnx_equal, rng, op, include) -> None:
    # EfficientNet's exported pooler: kernel 1280 with ceil_mode over 7x7 (one window). Padding the
    # input to the window's length took 8 GB for 1280 channels; cut to the input it is exact.
    attrs: dict[str, Any] = {"kernel_shape": [40, 40], "strides": [40, 40], "ceil_mode": 1}
    if op == "AveragePool":
        attrs["count_include_pad"] = include
    elif include:
        return
    node = N(op, ["x"], ["y"], **attrs)
    _run(onnx_model, onnx_equal, node, [("x", f32, _x(rng, (1, 64, 7, 5), f32))], opset=19)
