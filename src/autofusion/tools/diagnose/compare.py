"""What a compiled model is compared against, and how: the one comparison every tool uses.

- `compare_tensors(out, ref)`: cosine similarity, max absolute, max relative and the scaled error
  (max |out - ref| / max |ref|) of one tensor against its reference;
- `relative_error(out, ref)`: the scaled error over every tensor leaf of a (nested) output, `inf` when
  structure, shape or dtype differ (what demo, optimize --check and bisect judge a model by);
- `TOLERANCES` / `tolerance(dtype)` / `model_tolerance(inputs)`: the allowed scaled error and cosine per
  dtype (a whole model is judged at its lowest-precision floating input);
- `median_ms` / `best_ms`: wall time of whole-model calls;
- `baseline(model)`: what a model is compared with and timed against: eager PyTorch for a torch model;
  for an ONNX model onnxruntime, or the reference runtime (the IR run op by op) where onnxruntime is not
  installed or cannot load the file.

Non-finite values count as equal where both sides hold the same one; a NaN or infinity on one side
only makes the error infinite. Integer and boolean tensors must match exactly.

torch is imported inside the functions, so importing this module (the command line does, to build its
parser) stays cheap.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Tolerance:
    rtol: float  # largest scaled error, max |out - ref| / max |ref|
    min_cosine: float  # smallest cosine similarity (the precision check per fused kernel)


# Per dtype name. bfloat16 keeps 8 significant bits: one rounding step at the largest element is already
# 2^-8..2^-7 of max |ref| (0.4-0.8 %), so 2e-2 allows two; float16 keeps 11 bits, 1e-2 is ten steps.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-12, 0.9999999),
    "float32": Tolerance(1e-5, 0.99999),
    "float16": Tolerance(1e-2, 0.999),
    "bfloat16": Tolerance(2e-2, 0.999),
}
_ORDER = ("float64", "float32", "float16", "bfloat16")  # most precise first


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def tolerance(dtype: Any) -> Tolerance:
    """The tolerance of a dtype (a torch dtype or its name); non-float dtypes must match exactly."""
    return TOLERANCES.get(dtype_name(dtype), Tolerance(0.0, 1.0))


def model_tolerance(inputs: Sequence[Any]) -> float:
    """The rtol a whole model is judged at: that of its lowest-precision floating input (float32 when
    it has none)."""
    names = {dtype_name(getattr(t, "dtype", "")) for t in inputs}
    worst = max((_ORDER.index(n) for n in names if n in _ORDER), default=_ORDER.index("float32"))
    return TOLERANCES[_ORDER[worst]].rtol


@dataclass(frozen=True)
class Compared:
    cosine: float
    max_abs: float
    max_rel: float
    scaled: float


_WORST = Compared(0.0, math.inf, math.inf, math.inf)


def compare_tensors(out: torch.Tensor, ref: torch.Tensor) -> Compared:
    """One tensor against its reference. The relative error of an element is |out - ref| /
    max(|ref|, max|ref| / 1000): elements a thousand times smaller than the largest are measured
    against that floor, so values that are zero up to rounding do not report an infinite error."""
    import torch

    if out.shape != ref.shape:
        return _WORST
    if ref.numel() == 0:
        return Compared(1.0, 0.0, 0.0, 0.0)
    if not ref.dtype.is_floating_point:
        equal = bool(torch.equal(out.to(ref.dtype), ref))
        return Compared(1.0, 0.0, 0.0, 0.0) if equal else _WORST
    o, r = out.detach().double().flatten(), ref.detach().double().flatten()
    same = (o == r) | (o.isnan() & r.isnan())
    if not (torch.isfinite(o[~same]).all() and torch.isfinite(r[~same]).all()):
        return _WORST
    fo, fr = torch.where(same, 0.0, o), torch.where(same, 0.0, r)  # agreeing non-finite values drop out
    finite_r = torch.where(torch.isfinite(r), r, 0.0)
    diff = (fo - fr).abs()
    scale = finite_r.abs().max().item()
    max_abs = diff.max().item()
    floor = scale / 1000 if scale > 0 else 1.0
    max_rel = (diff / torch.clamp(finite_r.abs(), min=floor)).max().item()
    fin_o = torch.where(torch.isfinite(o), o, 0.0)
    no, nr = fin_o.norm().item(), finite_r.norm().item()
    if no == 0 and nr == 0:
        cosine = 1.0
    elif no == 0 or nr == 0:
        cosine = 0.0
    else:
        cosine = min(1.0, float(torch.dot(fin_o, finite_r).item() / (no * nr)))
    return Compared(cosine, max_abs, max_rel, max_abs / scale if scale > 0 else max_abs)


def flatten(obj: Any) -> list[Any]:
    """Leaves of a (nested) tensor / tuple / list / dict output, in a stable order."""
    if isinstance(obj, (tuple, list)):
        return [leaf for item in obj for leaf in flatten(item)]
    if isinstance(obj, dict):
        return [leaf for key in sorted(obj, key=str) for leaf in flatten(obj[key])]
    return [obj]


def relative_error(out: Any, ref: Any) -> float:
    """The largest scaled error over all tensor leaves; ``inf`` when structure, shape or dtype differ."""
    import torch

    outs, refs = flatten(out), flatten(ref)
    if len(outs) != len(refs):
        return math.inf
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        if not isinstance(r, torch.Tensor):
            if o != r:
                return math.inf
            continue
        if not isinstance(o, torch.Tensor) or o.shape != r.shape or o.dtype != r.dtype:
            return math.inf
        worst = max(worst, compare_tensors(o, r).scaled)
    return worst


# ---- timing --------------------------------------------------------------------------------------

WARMUP = 3


def median_ms(fns: Sequence[Callable[..., Any]], inputs: Sequence[Any], repeat: int,
              warmup: int = WARMUP) -> list[float]:  # fmt: skip
    """Median wall time of each ``fn(*inputs)`` in milliseconds, under ``torch.no_grad()``.

    The functions take turns within every round, so a noisy neighbour or a frequency change hits all
    of them alike instead of whichever happened to be measured first.
    """
    return [statistics.median(t) for t in _times(fns, inputs, repeat, warmup)]


def best_ms(fn: Callable[..., Any], inputs: Sequence[Any], repeat: int, warmup: int = WARMUP) -> float:
    """The fastest of `repeat` runs: on a shared machine one lost scheduler slice (15-25 ms) outweighs
    a model of microseconds, and a median of few runs does not hide it (bisect --slower compares these)."""
    return min(_times([fn], inputs, repeat, warmup)[0])


def _times(
    fns: Sequence[Callable[..., Any]], inputs: Sequence[Any], repeat: int, warmup: int
) -> list[list[float]]:
    import torch

    times: list[list[float]] = [[] for _ in fns]
    with torch.no_grad():
        for fn in fns:
            for _ in range(warmup):
                fn(*inputs)
        for _ in range(repeat):
            for k, fn in enumerate(fns):
                start = time.perf_counter()
                fn(*inputs)
                times[k].append((time.perf_counter() - start) * 1e3)
    return times


# ---- the reference ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    name: str  # "eager PyTorch", "onnxruntime" or "reference runtime"
    run: Callable[..., Any]  # inputs -> outputs (a tensor, or a tuple for several outputs)


def is_onnx_model(model: Any) -> bool:
    """An ONNX source (a path, a ModelProto or its bytes) rather than a torch module or function."""
    if isinstance(model, (str, Path, bytes)):
        return True
    return type(model).__name__ == "ModelProto"


def baseline(model: Any, graph: Any = None) -> Baseline:
    """What `model` is compared with and timed against. For an ONNX model without a usable onnxruntime,
    the reference runtime runs `graph` (the imported IR graph: the compiled model's `.graph`) op by op,
    or, when `graph` is None, the model compiled with fusion off (which runs on the same runtime)."""
    if not is_onnx_model(model):
        return Baseline("eager PyTorch", model)
    sess = ort_session(model)
    if sess is not None:
        return Baseline("onnxruntime", lambda *xs: ort_run(sess, list(xs)))
    if graph is None:
        from autofusion import api

        return Baseline("reference runtime", api.compile(model, fusion=False))
    return Baseline("reference runtime", lambda *xs: _run_reference(graph, xs))


def _run_reference(graph: Any, inputs: Sequence[Any]) -> Any:
    from autofusion.ir.interpret import run_graph

    outs = run_graph(graph, list(inputs))
    return outs[0] if len(outs) == 1 else tuple(outs)


def ort_session(model: Any) -> Any:
    """An onnxruntime session for the model (from its path, so external data is found), or None when
    onnxruntime is not installed or cannot load the model (then the reference runtime checks)."""
    import logging

    try:
        import onnxruntime as ort
    except ImportError:
        return None
    if model is None:
        return None
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    source = str(source) if isinstance(source, Path) else source
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types; we only report and move on
        logging.getLogger(__name__).warning(
            "onnxruntime cannot load %s (%s); comparing with the reference runtime", model, e
        )
        return None


def ort_run(sess: Any, inputs: list[Any]) -> Any:
    import torch

    feeds = {i.name: (t.numpy() if isinstance(t, torch.Tensor) else t)
             for i, t in zip(sess.get_inputs(), inputs, strict=False)}  # fmt: skip
    outs = [torch.from_numpy(o) for o in sess.run(None, feeds)]
    return outs[0] if len(outs) == 1 else tuple(outs)
