"""Graphs with a dtype no IR op computes on (complex, float8): torch runs those ops as extern calls, the
rest still fuses, each fallback is logged with its reason, on both routes. (uint16/32/64 were opaque too
until the C++ backend computed on them: the last test here checks a uint32 chain now fuses.)"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch

import autofusion
from autofusion.backend import autofusion_backend
from autofusion.errors import IRVerifyError
from autofusion.ir import DType, GraphBuilder, TensorType, verify
from autofusion.ir.dtypes import UnsupportedDTypeError


def rfft_of_fused(x: torch.Tensor) -> torch.Tensor:
    return torch.fft.rfft(torch.special.bessel_j0(x) * 2 + x.sigmoid()).abs()


def complex_output(x: torch.Tensor) -> torch.Tensor:
    return torch.fft.rfft((x * 2).sin() + 1)


def through_uint32(x: torch.Tensor) -> torch.Tensor:
    # uint32 supports few CPU ops in torch (no add); & and casts it has.
    u = (x.abs() * 10).to(torch.uint32) & 7
    return (u.to(torch.float32) * 0.5 + x).sin()


def through_float8(x: torch.Tensor) -> torch.Tensor:
    # float8 has casts on the CPU and little else
    u = (x * 2).to(torch.float8_e4m3fn)
    return (u.to(torch.float32) * 0.5 + x).sin()


def complex_input(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (z * 2).abs() * x.exp() + 1


CASES: list[tuple[str, Callable[..., torch.Tensor], Callable[[], list[torch.Tensor]], str]] = [
    ("rfft between fused ops", rfft_of_fused, lambda: [torch.randn(64)], "complex64"),
    ("complex graph output", complex_output, lambda: [torch.randn(4, 30)], "complex64"),
    ("float8 intermediate", through_float8, lambda: [torch.randn(5, 7)], "float8_e4m3fn"),
    ("complex graph input", complex_input,
     lambda: [torch.randn(6, 5, dtype=torch.complex64), torch.randn(6, 5)], "complex64"),
]  # fmt: skip


def _check(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert (got.dtype, got.shape) == (ref.dtype, ref.shape)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,fn,make,dtype", CASES, ids=[c[0] for c in CASES])
def test_direct_api_runs_opaque_ops_as_extern_calls(name, fn, make, dtype, caplog) -> None:
    inputs = make()
    with caplog.at_level(logging.INFO, logger="autofusion.frontend"), torch.no_grad():
        cm = autofusion.compile(fn, inputs)
        _check(cm(*inputs), fn(*inputs))
    assert "eager_fallback" not in cm.stats
    assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1, cm.stats
    reason = f"# reason: dtype {dtype} has no IR equivalent"
    lines = [r.getMessage() for r in caplog.records if reason in r.getMessage()]
    # One line per op at its first fallback (the op and its argument types), one in the summary.
    assert any(line.startswith("Fallback aten.") for line in lines), caplog.text
    assert all(line.startswith("Fallback ") and " aten." in line for line in lines), caplog.text
    assert any(key.endswith(reason) for key in cm.stats["fallbacks"]), cm.stats
    assert any(t.dtype.name == dtype for t in cm.graph.value_types().values())  # carried by the IR


@pytest.mark.parametrize("name,fn,make,dtype", CASES, ids=[c[0] for c in CASES])
def test_torch_compile_backend_runs_opaque_ops_as_extern_calls(name, fn, make, dtype) -> None:
    inputs = make()
    graphs: list = []

    def recording_backend(gm, example_inputs):
        compiled = autofusion_backend(gm, example_inputs)
        graphs.append(getattr(compiled, "autofusion_graph", None))
        return compiled

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend=recording_backend, fullgraph=True, dynamic=False)(*inputs)
        _check(got, fn(*inputs))
    assert graphs and all(g is not None for g in graphs), "the backend ran the graph eagerly"
    program = graphs[0].program
    assert "build_error" not in program.stats and program.stats["fused_kernels"] >= 1, program.stats
    reason = f"# reason: dtype {dtype} has no IR equivalent"
    assert any(key.endswith(reason) for key in graphs[0].stats()["fallbacks"])


def test_the_verifier_keeps_opaque_values_out_of_ir_ops() -> None:
    b = GraphBuilder("opaque")
    z = b.add_input(TensorType(DType.complex64, (3,)), "z")
    out = b.add("neg", [z])
    with pytest.raises(IRVerifyError, match="only extern calls may take"):
        verify(b.build([out]))


def test_a_dtype_the_ir_cannot_carry_runs_eagerly_with_a_reason(monkeypatch, caplog) -> None:
    """A torch dtype newer than the IR's list cannot even be carried: the model runs eagerly, with the
    reason logged and kept in the stats, on both routes; never a crash. (float64 plays that dtype.)"""
    real = DType.from_torch

    def from_torch(dt: torch.dtype) -> DType:
        if dt is torch.float64:
            raise UnsupportedDTypeError(f"dtype {dt} cannot be carried by the IR")
        return real(dt)

    monkeypatch.setattr(DType, "from_torch", staticmethod(from_torch))
    x = torch.randn(8)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return (t.double() * 2).float() + 1

    with caplog.at_level(logging.WARNING):
        cm = autofusion.compile(fn, [x])
        torch.testing.assert_close(cm(x), fn(x))
        assert "cannot be carried by the IR" in cm.stats["eager_fallback"]
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="autofusion")(x), fn(x))
    assert caplog.text.count("cannot be carried by the IR") >= 2


def test_debug_dumps_take_opaque_values(tmp_path, caplog) -> None:
    x = torch.randn(16)
    with caplog.at_level(logging.WARNING, logger="autofusion"):
        cm = autofusion.compile(complex_output, [x], debug_dir=str(tmp_path))
        _check(cm(x), complex_output(x))
    assert "debug dump" not in caplog.text, caplog.text
    assert list(tmp_path.rglob("*.onnx")), "no ONNX picture of the graph was written"


def test_a_uint32_chain_fuses_now_that_kernels_compute_on_it(generated_code_ran) -> None:
    x = torch.randn(5, 7)
    cm = autofusion.compile(through_uint32, [x])
    _check(cm(x), through_uint32(x))
    generated_code_ran(cm.stats, "uint32 chain", expect_kernel=True)
    assert not cm.stats.get("fallbacks"), cm.stats["fallbacks"]
