"""uint16, uint32 and uint64 (and bool) through the ONNX route, against onnxruntime.

Eager torch has almost no kernels for the wide unsigned types, so these run in generated C++ (each test
checks a kernel ran) or, for what does not fuse, in the reference runtime widened exactly
(ir/unsigned.py). Values cover the whole range: above 2^31 for uint32, above 2^63 for uint64, the
maximum, and pairs whose difference wraps. Where onnxruntime has no kernel for an op and type (it
lacks Max/Min on uint16, for one) numpy's result is the reference, and the test says so.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import autofusion
from autofusion.ir import unsigned

from .conftest import assert_same, run_ort

N = helper.make_node
UNSIGNED = [np.uint16, np.uint32, np.uint64]
IDS = ["u16", "u32", "u64"]


def values(dtype: type, shape: tuple[int, ...], rng: np.random.Generator, low: int = 0) -> np.ndarray:
    """Random values over the type's whole range with its edge values mixed in (0, 1, 2^(bits-1), max)."""
    info = np.iinfo(dtype)
    x = rng.integers(low, int(info.max), size=shape, dtype=dtype, endpoint=True)
    edges = np.array([low, 1, (int(info.max) >> 1) + 1, int(info.max), int(info.max) - 1], dtype=dtype)
    flat = x.reshape(-1)
    flat[: min(len(edges), flat.size)] = edges[: flat.size]
    return x


def ran_kernel(cm: autofusion.CompiledModel) -> None:
    stats = cm.stats
    assert "eager_fallback" not in stats and not stats.get("build_error"), stats
    assert stats.get("kernel_steps", 0) >= 1 and stats.get("generated_calls", 0) >= 1, stats


def reference(model, arrays: list[np.ndarray], numpy_fn) -> list[np.ndarray]:
    """onnxruntime's outputs; numpy's (checked equal to onnxruntime wherever it runs) where it has no
    kernel for this op and type."""
    want = numpy_fn(*arrays)
    want = list(want) if isinstance(want, tuple) else [want]
    try:
        got = run_ort(model, arrays)
    except Exception as e:  # noqa: BLE001 - only a missing onnxruntime kernel is accepted
        assert "NOT_IMPLEMENTED" in str(e) or "Could not find an implementation" in str(e), e
        return want
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    return got


def _compile_and_check(model, arrays, numpy_fn, kernel: bool = True, **options) -> autofusion.CompiledModel:
    ref = reference(model, arrays, numpy_fn)
    cm = autofusion.compile(model, **options)
    out = cm(*arrays)
    outs = out if isinstance(out, tuple) else (out,)
    for k, (g, r) in enumerate(zip(outs, ref, strict=True)):
        r = np.asarray(r)
        # onnxruntime returns uint64 as numpy's ulonglong, the same type by another name
        assert_same(g, r.view(np.uint64) if r.dtype.char == "Q" else r, f"output {k}")
    if kernel:
        ran_kernel(cm)
    return cm


def _wrap(fn):
    def run(*a):
        with np.errstate(all="ignore"):
            return fn(*a)

    return run


BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.floor_divide,
    "Max": np.maximum,
    "Min": np.minimum,
    "BitwiseAnd": np.bitwise_and,
    "BitwiseOr": np.bitwise_or,
    "BitwiseXor": np.bitwise_xor,
    "Equal": np.equal,
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
}


@pytest.mark.parametrize("dtype", UNSIGNED, ids=IDS)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_ops_wrap_compare_and_divide_unsigned(onnx_model, rng, op: str, dtype: type) -> None:
    shape = (3, 7)
    a = values(dtype, shape, rng)
    b = values(dtype, (7,), rng, low=1)  # broadcast; no division by zero
    out_dtype = np.bool_ if op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual") else dtype
    model = onnx_model(
        [N(op, ["a", "b"], ["y"])],
        [("a", dtype, shape), ("b", dtype, [7])],
        [("y", out_dtype, shape)],
        opset=18,
    )
    _compile_and_check(model, [a, b], _wrap(BINARY[op]))


@pytest.mark.parametrize("dtype", UNSIGNED, ids=IDS)
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_on_unsigned(onnx_model, rng, dtype: type, fmod: int) -> None:
    a, b = values(dtype, (4, 9), rng), values(dtype, (4, 9), rng, low=1)
    b[0, :3] = [1, 3, 7]
    model = onnx_model(
        [N("Mod", ["a", "b"], ["y"], fmod=fmod)],
        [("a", dtype, [4, 9]), ("b", dtype, [4, 9])],
        [("y", dtype, [4, 9])],
    )
    _compile_and_check(model, [a, b], np.remainder)


@pytest.mark.parametrize("super_kernel", ["off", "on"])
@pytest.mark.parametrize("dtype", UNSIGNED, ids=IDS)
def test_a_fused_chain_with_wraparound_and_a_select(onnx_model, rng, dtype: type, super_kernel: str) -> None:
    """(a - b) * c + 1, then max with a, where a > b: one kernel; the subtraction wraps below zero."""
    shape = (5, 33)
    a, b, c = (values(dtype, shape, rng) for _ in range(3))
    one = np.array(1, dtype=dtype)
    model = onnx_model(
        [
            N("Sub", ["a", "b"], ["d"]),
            N("Mul", ["d", "c"], ["m"]),
            N("Add", ["m", "one"], ["s"]),
            N("Max", ["s", "a"], ["mx"]),
            N("Greater", ["a", "b"], ["g"]),
            N("Where", ["g", "mx", "b"], ["y"]),
        ],
        [("a", dtype, shape), ("b", dtype, shape), ("c", dtype, shape)],
        [("y", dtype, shape)],
        {"one": one},
    )

    def ref(a, b, c):
        with np.errstate(all="ignore"):
            return np.where(a > b, np.maximum((a - b) * c + one, a), b)

    cm = _compile_and_check(model, [a, b, c], ref, super_kernel=super_kernel)
    assert cm.stats["kernels"] == 1, cm.stats


CASTS = [
    (np.uint32, np.int64),  # no sign extension: 2^32 - 1 stays 4294967295
    (np.uint16, np.int32),
    (np.uint64, np.int64),  # wraps to negative from 2^63 on
    (np.uint64, np.float32),
    (np.uint32, np.float32),
    (np.int32, np.uint64),  # -1 becomes 2^64 - 1
    (np.int64, np.uint32),  # wraps modulo 2^32
    (np.float32, np.uint32),
    (np.float32, np.uint16),
    (np.float32, np.uint64),
    (np.uint64, np.uint16),
    (np.bool_, np.uint32),
    (np.uint32, np.bool_),
]


@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{np.dtype(s).name}-{np.dtype(d).name}" for s, d in CASTS])
def test_casts_to_and_from_unsigned(onnx_model, rng, src: type, dst: type) -> None:
    shape = (2, 11)
    if np.dtype(src).kind == "f":
        # in range of the target (out-of-range float -> int is undefined in ONNX)
        hi = float(np.iinfo(dst).max) * 0.99 if dst is not np.uint64 else 1.8e19
        x = (rng.random(shape) * hi).astype(src)
        x[0, :3] = [0.0, 0.7, 2.0**31 + 256 if dst is not np.uint16 else 65535.0]
    elif src is np.bool_:
        x = rng.random(shape) > 0.5
    elif np.dtype(src).kind == "i":
        x = rng.integers(np.iinfo(src).min, np.iinfo(src).max, size=shape, dtype=src)
        x[0, :2] = [-1, np.iinfo(src).min]
    else:
        x = values(src, shape, rng)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    model = onnx_model([N("Cast", ["x"], ["y"], to=to)], [("x", src, shape)], [("y", dst, shape)])
    _compile_and_check(model, [x], lambda x: x.astype(dst))


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64], ids=["u32", "u64"])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin"])
def test_reductions_on_unsigned(onnx_model, rng, op: str, dtype: type) -> None:
    x = values(dtype, (6, 40), rng)
    axes = np.array([1], dtype=np.int64)
    model = onnx_model(
        [N(op, ["x", "axes"], ["y"], keepdims=0)],
        [("x", dtype, [6, 40])],
        [("y", dtype, [6])],
        {"axes": axes},
        opset=18,
    )
    fn = {
        "ReduceSum": lambda x: np.sum(x, axis=1, dtype=dtype),
        "ReduceMax": lambda x: np.max(x, axis=1),
        "ReduceMin": lambda x: np.min(x, axis=1),
    }[op]
    _compile_and_check(model, [x], fn)


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64], ids=["u32", "u64"])
def test_a_product_wraps(onnx_model, rng, dtype: type) -> None:
    x = values(dtype, (4, 24), rng)
    axes = np.array([1], dtype=np.int64)
    model = onnx_model(
        [N("ReduceProd", ["x", "axes"], ["y"], keepdims=0)], [("x", dtype, [4, 24])], [("y", dtype, [4])],
        {"axes": axes}, opset=18,
    )  # fmt: skip
    _compile_and_check(model, [x], lambda x: np.prod(x, axis=1, dtype=dtype))


@pytest.mark.parametrize("dtype", UNSIGNED, ids=IDS)
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions_order_unsigned(onnx_model, rng, op: str, dtype: type) -> None:
    """Not fused (arg-reductions are library work): the reference runtime orders uint64 by its biased view."""
    x = values(dtype, (5, 9), rng)
    model = onnx_model(
        [N(op, ["x"], ["y"], axis=1, keepdims=0)], [("x", dtype, [5, 9])], [("y", np.int64, [5])]
    )
    fn = np.argmax if op == "ArgMax" else np.argmin
    _compile_and_check(model, [x], lambda x: fn(x, axis=1).astype(np.int64), kernel=False)


@pytest.mark.parametrize("dtype", UNSIGNED, ids=IDS)
def test_clip_with_bounds_above_the_signed_range(onnx_model, rng, dtype: type) -> None:
    x = values(dtype, (3, 10), rng)
    top = int(np.iinfo(dtype).max)
    lo, hi = np.array(top // 4, dtype=dtype), np.array(top - top // 4, dtype=dtype)
    model = onnx_model(
        [N("Clip", ["x", "lo", "hi"], ["y"])],
        [("x", dtype, [3, 10])],
        [("y", dtype, [3, 10])],
        {"lo": lo, "hi": hi},
    )
    _compile_and_check(model, [x], lambda x: np.clip(x, lo, hi))


def test_bool_inputs_and_outputs(onnx_model, rng) -> None:
    a, b = rng.random((4, 17)) > 0.5, rng.random((4, 17)) > 0.3
    model = onnx_model(
        [
            N("And", ["a", "b"], ["t"]),
            N("Not", ["t"], ["n"]),
            N("Xor", ["n", "b"], ["x"]),
            N("Or", ["x", "a"], ["y"]),
            N("Equal", ["y", "b"], ["e"]),
        ],
        [("a", np.bool_, [4, 17]), ("b", np.bool_, [4, 17])],
        [("y", np.bool_, [4, 17]), ("e", np.bool_, [4, 17])],
    )
    _compile_and_check(model, [a, b], lambda a, b: ((~(a & b) ^ b) | a, ((~(a & b) ^ b) | a) == b))


def test_an_extern_on_uint32_runs_widened_and_on_uint64_says_why_not(onnx_model, rng) -> None:
    """TopK on uint32 runs widened to int64 and converted back; on uint64 on its own bits."""
    x = values(np.uint32, (3, 8), rng)
    k = np.array([3], dtype=np.int64)

    def topk(x):
        idx = np.argsort(-x.astype(object), axis=1, kind="stable")[:, :3]  # exact for uint64 too
        return np.take_along_axis(x, idx, axis=1), idx.astype(np.int64)

    model = onnx_model(
        [N("TopK", ["x", "k"], ["v", "i"])],
        [("x", np.uint32, [3, 8])],
        [("v", np.uint32, [3, 3]), ("i", np.int64, [3, 3])],
        {"k": k},
    )
    _compile_and_check(model, [x], topk, kernel=False)
    x64 = values(np.uint64, (3, 8), rng)
    model = onnx_model(
        [N("TopK", ["x", "k"], ["v", "i"])],
        [("x", np.uint64, [3, 8])],
        [("v", np.uint64, [3, 3]), ("i", np.int64, [3, 3])],
        {"k": k},
    )
    # TopK is a stable sort (ties in index order), which torch runs on uint64's bits: exact.
    _compile_and_check(model, [x64], topk, kernel=False)


# ---- IR graphs straight through the compiler (what ONNX cannot say: it has no uint16 ReduceProd) ----


@pytest.mark.parametrize("op", ["prod", "sum", "amax", "amin"])
@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=IDS)
def test_unsigned_reduction_kernels_wrap_and_order(tmp_path, op: str, dtype: torch.dtype) -> None:
    """A uint16 product multiplies in uint32 (C promotes uint16_t to int, where 65535 * 65535 overflows)."""
    from autofusion.compiler import compile_graph
    from autofusion.config import Options
    from autofusion.ir import DType, GraphBuilder, TensorType

    npd = {torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}[dtype]
    dt = DType.from_torch(dtype)
    b = GraphBuilder(f"u_{op}")
    x = b.add_input(TensorType(dt, (6, 37)), "x")
    g = b.build([b.add(op, (x,), {"dims": (1,), "keepdim": False})])
    program = compile_graph(g, Options.from_env(cache_dir=str(tmp_path / "cache")))
    a = values(npd, (6, 37), np.random.default_rng(3))
    (got,) = program.executor.run([torch.from_numpy(a)])
    want = {"prod": lambda v: np.prod(v, axis=1, dtype=npd), "sum": lambda v: np.sum(v, axis=1, dtype=npd),
            "amax": lambda v: v.max(axis=1), "amin": lambda v: v.min(axis=1)}[op](a)  # fmt: skip
    np.testing.assert_array_equal(got.numpy(), want)
    assert program.plan.kernels and program.executor.generated_calls >= 1, program.stats


# ---- the reference runtime alone (what runs for ops that do not fuse) ----


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=IDS)
def test_reference_runtime_matches_numpy_on_every_binary_op(dtype: torch.dtype) -> None:
    from autofusion.ir import DType, GraphBuilder, TensorType
    from autofusion.ir.interpret import run_graph

    rng = np.random.default_rng(1)
    npd = {torch.uint16: np.uint16, torch.uint32: np.uint32, torch.uint64: np.uint64}[dtype]
    a, b = values(npd, (40,), rng), values(npd, (40,), rng, low=1)
    ops = {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "maximum": np.maximum,
        "minimum": np.minimum,
        "remainder": np.remainder,
        "fmod": np.fmod,
        "lt": np.less,
        "ge": np.greater_equal,
        "div": np.floor_divide,
    }
    dt = DType.from_torch(dtype)
    for op, fn in ops.items():
        bld = GraphBuilder(op)
        x, y = bld.add_input(TensorType(dt, (40,)), "x"), bld.add_input(TensorType(dt, (40,)), "y")
        attrs = {"rounding_mode": "trunc"} if op == "div" else {}
        g = bld.build([bld.add(op, (x, y), attrs)])
        (got,) = run_graph(g, [torch.from_numpy(a), torch.from_numpy(b)])
        with np.errstate(all="ignore"):
            want = fn(a, b)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=op)
    assert unsigned.involved(g.nodes[0], [torch.from_numpy(a)])


def test_frontend_reads_every_unsigned_elem_type() -> None:
    from autofusion.frontend.onnx.context import dtype_of
    from autofusion.ir import DType

    for code, d in (
        (TensorProto.UINT16, DType.uint16),
        (TensorProto.UINT32, DType.uint32),
        (TensorProto.UINT64, DType.uint64),
    ):
        assert dtype_of(code, "input 'x'") is d and d.is_unsigned and not d.is_opaque
