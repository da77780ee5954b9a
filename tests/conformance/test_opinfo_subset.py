"""PyTorch's own OpInfo samples for ~40 representative ops, through both routes, against eager.

The harness is benchmarks/conformance_torch.py (the full run lives there): each sample is wrapped in
exact elementwise flips so the op fuses with neighbours, and compared under OpInfo's tolerances. A
case passes only when every sample matched and ran generated code (no eager fallback, no build
error). Cases failing on today's code are strict xfails naming the bug: when a fix makes one pass,
the xfail fails, and its mark goes.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch

_SPEC = importlib.util.spec_from_file_location(
    "conformance_torch", Path(__file__).resolve().parents[2] / "benchmarks" / "conformance_torch.py"
)
ct = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
sys.modules.setdefault("conformance_torch", ct)  # its dataclasses look their module up there
_SPEC.loader.exec_module(ct)  # type: ignore[union-attr]

SAMPLES = 2  # the first samples of each op: OpInfo puts its plain cases (and its 0-d case) first
F32_F16 = ("float32", "float16")
WITH_BF16 = ("float32", "float16", "bfloat16")
OPS: dict[str, tuple[str, ...]] = {
    # elementwise unary
    "abs": F32_F16, "neg": F32_F16, "exp": WITH_BF16, "log": F32_F16, "sqrt": F32_F16, "rsqrt": F32_F16,
    "sigmoid": F32_F16, "tanh": WITH_BF16, "sin": F32_F16, "erf": F32_F16, "nn.functional.gelu": WITH_BF16,
    "nn.functional.silu": F32_F16, "nn.functional.relu": F32_F16, "round": F32_F16,
    "round.decimals_3": ("float32",), "round.decimals_neg_3": ("float32",),
    # elementwise binary, ternary
    "add": WITH_BF16, "sub": F32_F16, "mul": F32_F16, "div.no_rounding_mode": F32_F16, "maximum": F32_F16,
    "pow": F32_F16, "clamp": F32_F16, "where": F32_F16, "lerp": F32_F16,
    # casts
    "half": ("float32",), "bfloat16": ("float32",), "float": ("float16", "bfloat16"),
    # reductions and normalisations
    "sum": WITH_BF16, "mean": WITH_BF16, "var": WITH_BF16, "amax": F32_F16,
    "max.reduction_with_dim": ("float32",),
    "softmax": WITH_BF16, "log_softmax": F32_F16, "nn.functional.layer_norm": WITH_BF16,
    "nn.functional.rms_norm": F32_F16,
    # views and data movement
    "permute": F32_F16, "reshape": F32_F16, "transpose": F32_F16, "expand": F32_F16, "slice": F32_F16,
    "cat": F32_F16, "index_select": F32_F16,
    # matmul family (ATen inside, elementwise around)
    "matmul": F32_F16, "nn.functional.linear": ("float32",), "baddbmm": ("float32",),
    # dtypes the IR only carries (complex): extern calls between generated kernels
    "fft.rfft": ("float32",), "view_as_complex": ("float32",),
}  # fmt: skip
ROUTES = ("direct", "dynamo")

# (op, dtype or "*", route or "*") -> the bug it shows on today's code.
XFAIL: dict[tuple[str, str, str], str] = {}

DB = {ct.op_key(o): o for o in ct.load_op_db()}


def _params() -> list:
    out = []
    for name, dtypes in OPS.items():
        for dt in ct.supported_dtypes(DB[name], list(dtypes)):
            for route in ROUTES:
                why = next((w for (o, d, r), w in XFAIL.items()
                            if o == name and d in ("*", dt) and r in ("*", route)), None)  # fmt: skip
                marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
                out.append(pytest.param(name, dt, route, id=f"{name}-{dt}-{route}", marks=marks))
    return out


def test_every_listed_op_is_in_the_database():
    missing = [n for n in OPS if n not in DB]
    assert not missing, f"op_db has no {missing}"
    unsupported = [(n, d) for n, ds in OPS.items() for d in ds if d not in ct.supported_dtypes(DB[n], [d])]
    assert not unsupported, f"these ops do not take these dtypes on CPU: {unsupported}"


@pytest.fixture(autouse=True)
def _quiet_logs():
    """The fallback warnings are expected here; later tests read these loggers, so levels come back."""
    saved = {n: logging.getLogger(n).level for n in ct.QUIET_LOGGERS}
    for n in ct.QUIET_LOGGERS:
        logging.getLogger(n).setLevel(logging.ERROR)
    yield
    for n, level in saved.items():
        logging.getLogger(n).setLevel(level)


@pytest.mark.parametrize(("name", "dtype", "route"), _params())
def test_opinfo_samples_match_eager(name: str, dtype: str, route: str) -> None:
    with torch.inference_mode():
        records = list(ct.run_op(DB[name], dtype, [route], SAMPLES, timeout_s=120.0))
    ran = [r for r in records if r["status"] != "skip"]
    assert ran, f"no sample of {name} {dtype} could be run: {[r.get('message') for r in records]}"
    bad = [r for r in ran if r["status"] != "pass" or not r.get("generated")]
    assert not bad, "\n".join(
        f"sample {r['index']} {r.get('sample', '')}: {r['status']}"
        f"{'' if r.get('generated') else ' (no generated kernel ran)'}: {r.get('message', '')}"
        for r in bad
    )
