"""ONNX losses, composite reductions, scans, bit ops, quantized matmuls and the small math ops, each
compiled with autofusion and compared with onnxruntime (fp32, fp16 where the op takes it).

Where a converter lowers to IR the test also checks that generated code ran (the onnx_equal fixture)
and, for the patterns that should fuse, how many kernels and library calls the plan holds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import autofusion
from autofusion.errors import FrontendError
from autofusion.frontend.onnx.externs_math import cumulative, unsigned_shift

N = helper.make_node
f32, f16, f64, i64, i32 = np.float32, np.float16, np.float64, np.int64, np.int32
i8, u8 = np.int8, np.uint8


@pytest.fixture
def model(onnx_model):
    """onnx_model with the IR version the opset needs (newer opsets need newer IR versions)."""

    def make(*args, opset: int = 17, **kw):
        m = onnx_model(*args, opset=opset, **kw)
        m.ir_version = max(8, helper.find_min_ir_version_for([helper.make_opsetid("", opset)]))
        return m

    return make


# ---- losses ------------------------------------------------------------------------------------


def _targets(rng, shape, classes, ignore):
    t = rng.integers(0, classes, size=shape).astype(i64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore  # every third target ignored
    return t


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 2, -1, 9])
@pytest.mark.parametrize("shape", [(4, 5), (2, 5, 3, 2)])
def test_nll_loss(model, onnx_equal, rng, reduction, weighted, ignore, shape) -> None:
    n, c, *rest = shape
    attrs = {"reduction": reduction} | ({} if ignore is None else {"ignore_index": ignore})
    ins = ["x", "t"] + (["w"] if weighted else [])
    m = model(
        [N("NegativeLogLikelihoodLoss", ins, ["y"], **attrs)],
        [("x", f32, shape), ("t", i64, (n, *rest))] + ([("w", f32, (c,))] if weighted else []),
        [("y", f32, None)],
        opset=22,
    )
    arrays = [rng.standard_normal(shape).astype(f32), _targets(rng, (n, *rest), c, ignore)]
    cm = onnx_equal(m, *arrays, *([rng.random(c).astype(f32) + 0.5] if weighted else []))
    assert cm.stats["extern_calls"] == 0  # all IR: the gather and index_select run as library calls


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("dtype", [f32, f16])
def test_softmax_cross_entropy_with_log_prob(model, onnx_equal, rng, reduction, dtype) -> None:
    shape = (3, 7, 4)
    m = model(
        [N("SoftmaxCrossEntropyLoss", ["x", "t", "w"], ["y", "lp"], reduction=reduction, ignore_index=-3)],
        [("x", dtype, shape), ("t", i32, (3, 4)), ("w", dtype, (7,))],
        [("y", dtype, None), ("lp", dtype, shape)],
        opset=13,
    )
    t = _targets(rng, (3, 4), 7, -3).astype(i32)
    cm = onnx_equal(m, (3 * rng.standard_normal(shape)).astype(dtype), t, (rng.random(7) + 0.5).astype(dtype))
    assert cm.stats["kernels"] >= 1


def test_nll_fp16_and_ignored_minus_inf(model, onnx_equal, rng) -> None:
    # an ignored target's class-0 log-probability of -inf must not turn the loss into NaN
    x = rng.standard_normal((4, 3)).astype(f16)
    x[:, 0] = -np.inf
    t = np.array([1, 5, 2, 5], i64)
    m = model(
        [N("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], reduction="sum", ignore_index=5)],
        [("x", f16, (4, 3)), ("t", i64, (4,))],
        [("y", f16, None)],
        opset=22,
    )
    onnx_equal(m, x, t)


# ---- composite reductions ------------------------------------------------------------------------


_COMPOSITE = ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", _COMPOSITE)
@pytest.mark.parametrize(("axes", "keep"), [([1], 1), ([-1, 0], 0), (None, 1)])
@pytest.mark.parametrize("dtype", [f32, f16])
def test_composite_reductions(model, onnx_equal, rng, op, axes, keep, dtype) -> None:
    inits = {} if axes is None else {"axes": np.array(axes, i64)}
    m = model(
        [N(op, ["x"] + (["axes"] if axes is not None else []), ["y"], keepdims=keep)],
        [("x", dtype, (3, 5, 4))],
        [("y", dtype, None)],
        inits,
        opset=18,
    )
    x = rng.random((3, 5, 4)).astype(dtype) + 0.1  # positive: ReduceLogSum takes the log of the sum
    cm = onnx_equal(m, x)
    assert cm.stats["extern_calls"] == 0 and cm.stats["kernels"] >= 1


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum"])
@pytest.mark.parametrize("dtype", [i32, i64])
def test_composite_reductions_of_ints(model, onnx_equal, op, dtype) -> None:
    # L2 and LogSum truncate back to the int type; log(0) = -inf is the type's minimum, as onnxruntime
    x = np.array([[3, 4, 0, 0], [1, 1, 1, 0], [2, 2, 1, 1], [0, 0, 0, 0], [-5, 0, 0, 0], [1, 1, 0, 0]], dtype)
    m = model(
        [N(op, ["x", "axes"], ["y"], keepdims=0)],
        [("x", dtype, x.shape)],
        [("y", dtype, None)],
        {"axes": np.array([1], i64)},
        opset=18,
    )
    onnx_equal(m, np.abs(x) if op == "ReduceLogSum" else x)


@pytest.mark.parametrize("op", _COMPOSITE)
def test_composite_reductions_noop_with_empty_axes(model, onnx_equal, rng, op) -> None:
    m = model(
        [N(op, ["x", "axes"], ["y"], noop_with_empty_axes=1)],
        [("x", f32, (3, 4))],
        [("y", f32, None)],
        {"axes": np.array([], i64)},
        opset=18,
    )
    onnx_equal(m, rng.random((3, 4)).astype(f32) + 0.5)


@pytest.mark.parametrize("op", _COMPOSITE)
def test_composite_reductions_over_an_empty_dim(model, onnx_equal, op) -> None:
    m = model(
        [N(op, ["x", "axes"], ["y"], keepdims=0)],
        [("x", f32, (2, 0, 3))],
        [("y", f32, None)],
        {"axes": np.array([1], i64)},
        opset=18,
    )
    onnx_equal(m, np.zeros((2, 0, 3), f32))


def test_log_sum_exp_is_stable(model, onnx_equal) -> None:
    # exp(1000) overflows fp32; rows of -inf give -inf; +inf gives +inf; NaN stays NaN
    x = np.array(
        [[1000.0, 999.0, 998.0], [-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0], [np.nan, 1.0, 0.0]], f32
    )
    m = model(
        [N("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=0)],
        [("x", f32, x.shape)],
        [("y", f32, None)],
        {"axes": np.array([1], i64)},
        opset=18,
    )
    cm = onnx_equal(m, x)
    assert np.isfinite(cm(x).numpy()[0])


# ---- ArgMax / ArgMin select_last_index ----------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(("axis", "keep"), [(0, 1), (1, 0), (-1, 1)])
@pytest.mark.parametrize("dtype", [f32, f16, i32])
def test_arg_reduce_select_last_index(model, onnx_equal, rng, op, axis, keep, dtype) -> None:
    x = rng.integers(0, 3, size=(4, 6)).astype(dtype)  # many ties
    m = model(
        [N(op, ["x"], ["y"], axis=axis, keepdims=keep, select_last_index=1)],
        [("x", dtype, x.shape)],
        [("y", i64, None)],
        opset=13,
    )
    onnx_equal(m, x)


# ---- Mod -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [f32, f16, f64])
def test_mod_floats(model, onnx_equal, rng, fmod, dtype) -> None:
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 3.0, -3.0, 7.25, np.inf, 2.0, np.nan, 1.0, -1.0], dtype)
    b = np.array(
        [2.0, 2.0, -2.0, -2.0, 3.0, -3.0, np.inf, np.inf, 0.5, 2.0, 0.0, 1.0, -np.inf, np.inf], dtype
    )
    m = model([N("Mod", ["a", "b"], ["y"], fmod=fmod)], [("a", dtype, (14,)), ("b", dtype, (14,))],
              [("y", dtype, (14,))], opset=28)  # fmt: skip
    onnx_equal(m, a, b)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [i8, i32, i64, u8])
def test_mod_ints(model, onnx_equal, rng, fmod, dtype) -> None:
    lo = 0 if dtype is u8 else -20
    a = rng.integers(lo, 20, size=(3, 8)).astype(dtype)
    b = rng.integers(1, 7, size=(8,)).astype(dtype)
    if dtype is not u8:
        b[::2] *= -1
    m = model([N("Mod", ["a", "b"], ["y"], fmod=fmod)], [("a", dtype, a.shape), ("b", dtype, b.shape)],
              [("y", dtype, a.shape)], opset=13)  # fmt: skip
    onnx_equal(m, a, b)


def test_float_mod_before_opset_28_is_refused(model) -> None:
    m = model(
        [N("Mod", ["a", "b"], ["y"])], [("a", f32, (3,)), ("b", f32, (3,))], [("y", f32, (3,))], opset=13
    )
    with pytest.raises(FrontendError, match="defined from opset 28"):
        autofusion.compile(m)


# ---- bits ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [u8, i8, i32, i64])
def test_bit_shift(model, onnx_equal, rng, direction, dtype) -> None:
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=(3, 7), endpoint=True).astype(dtype)
    bits = info.bits
    y = np.array([0, 1, 3, bits - 1, bits, bits + 5, -1 if info.min < 0 else 200], dtype)
    ins = [("x", dtype, x.shape), ("y", dtype, (7,))]
    m = model([N("BitShift", ["x", "y"], ["z"], direction=direction)], ins, [("z", dtype, x.shape)], opset=28)
    cm = onnx_equal(m, x, y)
    assert cm.stats["extern_calls"] == 1


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
@pytest.mark.parametrize("left", [True, False])
def test_unsigned_shift_matches_numpy(dtype, left) -> None:
    # torch has no uint16/32/64 shift kernels; the extern computes on the signed twin's bits
    bits = {torch.uint16: 16, torch.uint32: 32, torch.uint64: 64}[dtype]
    np_dtype = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2**bits - 1, size=40, dtype=np_dtype, endpoint=True)
    x[:4] = [0, 1, 2 ** (bits - 1), 2**bits - 1]
    y = rng.integers(0, bits + 8, size=40).astype(np_dtype)
    y[:4] = [0, bits - 1, bits - 1, 2**bits - 1]
    shifted = np.where(
        y < bits, (x << np.minimum(y, bits - 1)) if left else (x >> np.minimum(y, bits - 1)), 0
    )
    got = unsigned_shift(torch.from_numpy(x), torch.from_numpy(y), left)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), shifted.astype(np_dtype))


@pytest.mark.parametrize("dtype", [i8, u8, i32, i64])
def test_bitwise_not(model, onnx_equal, rng, dtype) -> None:
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=(5, 3), endpoint=True).astype(dtype)
    m = model([N("BitwiseNot", ["x"], ["y"])], [("x", dtype, x.shape)], [("y", dtype, x.shape)], opset=18)
    onnx_equal(m, x)


@pytest.mark.parametrize(
    ("src", "to", "dst"),
    [(f32, TensorProto.INT32, i32), (i32, TensorProto.FLOAT, f32), (f16, TensorProto.INT16, np.int16),
     (i8, TensorProto.UINT8, u8), (f64, TensorProto.INT64, i64)],
)  # fmt: skip
def test_bit_cast(model, onnx_equal, rng, src, to, dst) -> None:
    x = (rng.standard_normal((2, 3)) * 100).astype(src)
    m = model([N("BitCast", ["x"], ["y"], to=to)], [("x", src, x.shape)], [("y", dst, x.shape)], opset=26)
    onnx_equal(m, x)


# ---- EyeLike, Det, cumulative ops, Compress, NonZero ------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "k", "dtype"),
    [((4, 4), 0, None), ((3, 5), 2, TensorProto.DOUBLE), ((5, 3), -1, TensorProto.INT64), ((2, 6), 7, None)],
)
def test_eye_like(model, onnx_equal, rng, shape, k, dtype) -> None:
    out = {None: f32, TensorProto.DOUBLE: f64, TensorProto.INT64: i64}[dtype]
    attrs = {"k": k} | ({} if dtype is None else {"dtype": dtype})
    m = model([N("EyeLike", ["x"], ["y"], **attrs)], [("x", f32, shape)], [("y", out, shape)], opset=22)
    cm = onnx_equal(m, rng.standard_normal(shape).astype(f32))
    assert cm.stats["kernels"] == 1 and cm.stats["extern_calls"] == 0


@pytest.mark.parametrize(("shape", "dtype"), [((3, 3), f32), ((2, 4, 4), f32), ((3, 3), f16), ((1, 1), f32)])
def test_det(model, onnx_equal, rng, shape, dtype) -> None:
    m = model([N("Det", ["x"], ["y"])], [("x", dtype, shape)], [("y", dtype, shape[:-2])], opset=22)
    onnx_equal(m, rng.standard_normal(shape).astype(dtype))


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize(("dtype", "axis"), [(f32, 1), (f64, -2), (i32, 0), (i64, 1), (f16, 1)])
def test_cumulative(model, onnx_equal, rng, op, exclusive, reverse, dtype, axis) -> None:
    x = (
        (rng.random((3, 5)) * 3 + 0.5).astype(dtype)
        if dtype in (f32, f64, f16)
        else rng.integers(-3, 4, (3, 5))
    )
    x = x.astype(dtype)
    m = model(
        [N(op, ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
        [("x", dtype, x.shape)],
        [("y", dtype, x.shape)],
        {"axis": np.array(axis, i64)},
        opset=26,
    )
    cm = onnx_equal(m, x)
    assert cm.stats["extern_calls"] == 1


@pytest.mark.parametrize(
    ("cond", "axis"),
    [([True, False, True], 0), ([False, True], 1), ([False, True, True], 0), ([0, 1, 1, 0, 1], None),
     ([False, False, False], 0), ([True, True], -1)],
)  # fmt: skip
def test_compress_with_a_known_condition(model, onnx_equal, rng, cond, axis) -> None:
    attrs = {} if axis is None else {"axis": axis}
    m = model([N("Compress", ["x", "c"], ["y"], **attrs)], [("x", f32, (3, 2))], [("y", f32, None)],
              {"c": np.array(cond, bool)}, opset=13)  # fmt: skip
    onnx_equal(m, rng.standard_normal((3, 2)).astype(f32))


def test_compress_and_nonzero_of_run_time_values_are_refused(model) -> None:
    # A condition given as a graph input is read at each call (the graph is built per value) ...
    m = model([N("Compress", ["x", "c"], ["y"], axis=0)], [("x", f32, (3, 2)), ("c", bool, (3,))],
              [("y", f32, None)], opset=13)  # fmt: skip
    cm, x = autofusion.compile(m), torch.arange(6.0).reshape(3, 2)
    for cond in ([True, False, True], [False, True, True]):
        torch.testing.assert_close(cm(x, torch.tensor(cond)), x[torch.tensor(cond)])
    # ... one computed from the data cannot be.
    m = model([N("Greater", ["v", "zero"], ["c"]), N("Compress", ["x", "c"], ["y"], axis=0)],
              [("x", f32, (3, 2)), ("v", f32, (3,)), ("zero", f32, ())], [("y", f32, None)],
              opset=13)  # fmt: skip
    with pytest.raises(FrontendError, match=r"condition .* computed at run time"):
        autofusion.compile(m)(torch.randn(3, 2), torch.randn(3), torch.tensor(0.0))
    m = model([N("NonZero", ["x"], ["y"])], [("x", f32, (3, 2))], [("y", i64, None)], opset=13)
    with pytest.raises(FrontendError, match="output shape depends on the input's values"):
        autofusion.compile(m)


# ---- quantized ----------------------------------------------------------------------------------------


def _q(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize(
    ("qa", "qb", "qy", "a_shape", "b_shape", "scale_dtype", "per"),
    [(u8, u8, u8, (2, 4), (4, 3), f32, False), (i8, i8, i8, (2, 3, 5), (5, 4), f32, True),
     (u8, u8, u8, (3, 300), (300, 2), f32, True), (i8, i8, i8, (4, 6), (6, 5), f16, False)],
)  # fmt: skip
def test_qlinear_matmul(model, onnx_equal, rng, qa, qb, qy, a_shape, b_shape, scale_dtype, per) -> None:
    n_cols = b_shape[-1]
    a_s = (rng.random(1) * 0.05 + 0.01).astype(scale_dtype)  # onnxruntime: a's scale per tensor only
    b_s = (rng.random(n_cols if per else 1) * 0.05 + 0.01).astype(scale_dtype)
    y_s = np.array([0.5 if a_shape[-1] < 100 else 3.0], scale_dtype)
    # onnxruntime takes b's scale per column, zero points per tensor only
    inits = {"a_s": a_s, "a_z": _q(rng, qa, (1,)), "b_s": b_s, "b_z": _q(rng, qb, (1,)),
             "y_s": y_s, "y_z": _q(rng, qy, (1,))}  # fmt: skip
    m = model(
        [N("QLinearMatMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"])],
        [("a", qa, a_shape), ("b", qb, b_shape)],
        [("y", qy, None)],
        inits,
        opset=21,
    )
    onnx_equal(m, _q(rng, qa, a_shape), _q(rng, qb, b_shape))


@pytest.mark.parametrize(("qa", "qb", "zeros"), [(u8, u8, True), (i8, u8, False), (u8, i8, True)])
def test_matmul_integer(model, onnx_equal, rng, qa, qb, zeros) -> None:
    ins = ["a", "b"] + (["az", "bz"] if zeros else [])
    inits = {"az": _q(rng, qa, ()), "bz": _q(rng, qb, (4,))} if zeros else {}  # b's per column
    m = model([N("MatMulInteger", ins, ["y"])], [("a", qa, (3, 7)), ("b", qb, (7, 4))], [("y", i32, (3, 4))],
              inits, opset=13)  # fmt: skip
    onnx_equal(m, _q(rng, qa, (3, 7)), _q(rng, qb, (7, 4)))


@pytest.mark.parametrize("scale", [1.0, 10.0, -3.0, 0.0])
def test_dynamic_quantize_linear(model, onnx_equal, rng, scale) -> None:
    x = (rng.standard_normal((4, 5)) * scale + (0.5 if scale < 0 else 0)).astype(f32)
    m = model(
        [N("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
        [("x", f32, x.shape)],
        [("y", u8, x.shape), ("s", f32, []), ("z", u8, [])],
        opset=13,
    )
    onnx_equal(m, x)


@pytest.mark.parametrize(("q", "per_axis", "dtype"), [(u8, False, f32), (i8, True, f32), (u8, True, f16)])
def test_quantize_dequantize_linear(model, onnx_equal, rng, q, per_axis, dtype) -> None:
    shape = (2, 3, 4)
    s = (rng.random(3 if per_axis else ()) * 0.1 + 0.01).astype(dtype)
    z = _q(rng, q, s.shape)
    m = model(
        [
            N("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
            N("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1),
        ],
        [("x", dtype, shape)],
        [("q", q, shape), ("y", dtype, shape)],
        {"s": s, "z": z},
        opset=19,
    )
    cm = onnx_equal(m, (rng.standard_normal(shape) * 10).astype(dtype))
    assert cm.stats["kernels"] >= 1 and cm.stats["extern_calls"] == 0


def test_qlinear_matmul_per_row_a(model, rng) -> None:
    # per-row scales and zero points of a (onnxruntime refuses them): against the integer product in
    # numpy, requantized as onnxruntime does for the per-tensor case
    a, b = _q(rng, u8, (3, 6)), _q(rng, u8, (6, 4))
    a_s, a_z = np.array([0.02, 0.05, 0.03], f32), np.array([3, 130, 250], u8)
    b_s, b_z, y_s, y_z = np.array([0.04], f32), np.array([7], u8), np.array([0.3], f32), np.array([9], u8)
    m = model(
        [N("QLinearMatMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"])],
        [("a", u8, a.shape), ("b", u8, b.shape)],
        [("y", u8, (3, 4))],
        {"a_s": a_s, "a_z": a_z, "b_s": b_s, "b_z": b_z, "y_s": y_s, "y_z": y_z},
        opset=21,
    )
    acc = (a.astype(i64) - a_z.astype(i64)[:, None]) @ (b.astype(i64) - b_z.astype(i64))
    mult = (a_s[:, None] * b_s) / y_s
    want = np.clip(np.rint(acc.astype(f32) * mult.astype(f32)) + 9, 0, 255).astype(u8)
    np.testing.assert_array_equal(autofusion.compile(m)(a, b).numpy(), want)


@pytest.mark.parametrize("np_dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("prod", [False, True])
def test_unsigned_scans_wrap_as_numpy(np_dtype, prod) -> None:
    # torch has no uint16/32/64 scans; the extern scans the signed twin's bits (same wrap-around)
    x = np.random.default_rng(2).integers(0, np.iinfo(np_dtype).max, size=(3, 6), dtype=np_dtype)
    with np.errstate(over="ignore"):
        scan = (np.cumprod if prod else np.cumsum)(x[:, ::-1], 1, dtype=np_dtype)
    ident = np.full((3, 1), 1 if prod else 0, np_dtype)
    want = np.concatenate([ident, scan[:, :-1]], 1)[:, ::-1]  # exclusive and reverse
    got = cumulative(torch.from_numpy(x), 1, prod, exclusive=True, reverse=True)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize(
    ("precision", "opset"), [(None, 21), (None, 25), (TensorProto.FLOAT, 25), (TensorProto.FLOAT16, 25)]
)
def test_quantize_linear_division_precision(model, onnx_equal, precision, opset) -> None:
    # values whose x / scale rounds differently in fp16 and fp32 (onnxruntime, with no precision given:
    # fp32 before opset 23, the scale's type from then)
    x = np.array([17.58, 100.1, 29.06, 70.1, -118.25, -17.95, -96.75, 0.5], f16)
    attrs = {} if precision is None else {"precision": precision}
    m = model(
        [N("QuantizeLinear", ["x", "s", "z"], ["y"], **attrs)],
        [("x", f16, x.shape)],
        [("y", np.int16, x.shape)],
        {"s": np.array(0.37, f16), "z": np.array(0, np.int16)},
        opset=opset,
    )
    onnx_equal(m, x)
