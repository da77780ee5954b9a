"""The ONNX package's own backend node cases, a fixed representative subset, through autofusion.

The harness is benchmarks/conformance_onnx.py (the full run of all 1,884 cases lives there; its table is
in the README). Each case runs through onnxruntime first, as there: a case counts only where onnxruntime
passes it, so the test needs onnxruntime and is skipped, saying so, without it. Then through
`autofusion.compile(model)`, compared with the case's expected outputs under its own tolerances.

The list covers each converter family (unary and binary elementwise, activations, comparisons and logic,
bitwise, casts, reductions, normalisations, softmax, conv and pooling, matmul/gemm, shape and data
movement, externs) and the unsigned types, one or two cases each, small inputs, so the whole runs in
well under a minute. Add a family's case here when its converter lands.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the ONNX conformance cases count only where onnxruntime passes")

_SPEC = importlib.util.spec_from_file_location(
    "conformance_onnx", Path(__file__).resolve().parents[2] / "benchmarks" / "conformance_onnx.py"
)
co = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
sys.modules.setdefault("conformance_onnx", co)
_SPEC.loader.exec_module(co)  # type: ignore[union-attr]

CASES = (
    # unary math and activations
    "test_abs",
    "test_neg_example",
    "test_exp_example",
    "test_log_example",
    "test_sqrt_example",
    "test_reciprocal_example",
    "test_floor_example",
    "test_ceil_example",
    "test_round",
    "test_sign",
    "test_sin_example",
    "test_cos_example",
    "test_tan_example",
    "test_asin_example",
    "test_acos_example",
    "test_atan_example",
    "test_sinh_example",
    "test_cosh_example",
    "test_asinh_example",
    "test_acosh_example",
    "test_atanh_example",
    "test_tanh_example",
    "test_sigmoid_example",
    "test_erf",
    "test_relu",
    "test_leakyrelu_example",
    "test_elu_example",
    "test_gelu_default_1",
    "test_hardsigmoid_example",
    "test_hardswish",
    "test_mish",
    "test_softplus_example",
    "test_softsign_example",
    "test_prelu_broadcast",
    "test_clip_default_inbounds",
    "test_isnan",
    "test_isinf",
    # binary arithmetic, variadic, comparisons, logic, bitwise
    "test_add_bcast",
    "test_sub_example",
    "test_mul_example",
    "test_div_example",
    "test_pow_bcast_scalar",
    "test_mod_uint8",
    "test_max_one_input",
    "test_min_one_input",
    "test_sum_one_input",
    "test_mean_one_input",
    "test_equal_bcast",
    "test_less_bcast",
    "test_less_equal_bcast",
    "test_greater_bcast",
    "test_greater_equal_bcast",
    "test_where_example",
    "test_bitwise_and_i32_2d",
    "test_bitwise_or_i32_2d",
    "test_bitwise_xor_i32_2d",
    # the unsigned types: wrap-around, unsigned order and division, above 2^31 and 2^63
    "test_add_uint16",
    "test_sub_uint32",
    "test_mul_uint64",
    "test_div_uint32",
    "test_div_uint64",
    "test_mod_uint64",
    "test_max_uint64",
    "test_min_uint32",
    "test_less_equal_uint64",
    "test_greater_uint32",
    "test_equal_uint16",
    "test_bitwise_and_ui64_bcast_3v1d",
    # reductions, arg-reductions, normalisations, softmax
    "test_reduce_max_default_axes_keepdim_example",
    "test_reduce_min_default_axes_keepdims_example",
    "test_reduce_prod_default_axes_keepdims_example",
    "test_argmax_default_axis_example",
    "test_argmin_default_axis_example",
    "test_batchnorm_epsilon",
    "test_instancenorm_example",
    "test_softmax_example",
    "test_logsoftmax_example_1",
    # conv, pooling, matmul
    "test_basic_conv_with_padding",
    "test_convtranspose_1d",
    "test_averagepool_2d_ceil_last_window_starts_on_pad",
    "test_maxpool_2d_ceil_output_size_reduce_by_one",
    "test_globalaveragepool_precomputed",
    "test_globalmaxpool_precomputed",
    "test_matmul_1d_1d",
    "test_gemm_default_scalar_bias",
    "test_einsum_scalar",
    # shape and data movement, constants, identity
    "test_transpose_all_permutations_0",
    "test_concat_1d_axis_0",
    "test_flatten_axis0",
    "test_gather_2d_indices",
    "test_gather_elements_0",
    "test_split_equal_parts_1d_opset13",
    "test_depthtospace_crd_mode_example",
    "test_shape_example",
    "test_size_example",
    "test_constant",
    "test_identity",
    "test_dropout_default",
)


@pytest.fixture(scope="module")
def cases() -> dict[str, Any]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {c.name: c for c in co.load_cases() if c.name in CASES}


@pytest.mark.parametrize("name", CASES)
def test_backend_node_case(cases: dict[str, Any], name: str) -> None:
    assert name in cases, f"{name} is not among this onnx release's backend node cases"
    status, message = co.run_case(cases[name])
    assert status == "pass", f"{name}: {status}: {message}"


def test_the_subset_has_no_duplicates_and_nothing_out_of_scope() -> None:
    assert len(set(CASES)) == len(CASES)
    assert not set(CASES) & set(co.OUT_OF_SCOPE)


def test_every_out_of_scope_entry_fits_its_reason(cases: dict[str, Any]) -> None:
    listed = [c for c in co.load_cases() if c.name in co.OUT_OF_SCOPE]
    assert listed, "none of the out-of-scope cases exists in this onnx release"
    assert co.check_scope(listed) == []
    assert all(reason in co.SCOPE_CHECKS for reason in co.OUT_OF_SCOPE.values())
