"""MODEL arguments of the command line: `builtin:NAME`, an `.onnx` path, or `package.module:factory`.

In: the string a user typed (and, for ONNX models, sizes for symbolic dims). Out: `(model, example_inputs)`.
A factory is called with no arguments and must return that pair. For an `.onnx` file the model is the
path (`autofusion.compile` takes it) and the inputs are random tensors of the graph's declared input
shapes and dtypes (seeded), symbolic dims sized by `dims` (`--dim NAME=SIZE`). Every tool (optimize,
explain, check, bisect, report) loads through `load_model`. Errors are `ValueError`s that say which form
was expected and what went wrong (an unreadable ONNX file: the frontend's `CompilerError`). What a
model is compared with (eager PyTorch, onnxruntime) is tools/diagnose/compare.py's `baseline`.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

FORMS = "builtin:NAME, a path to an .onnx file, or package.module:factory"


def is_onnx_spec(spec: str) -> bool:
    return spec.endswith(".onnx") or Path(spec).is_file()


def parse_dims(specs: list[str]) -> dict[str, int]:
    """`["batch=4", "seq=16"]` -> {"batch": 4, "seq": 16}."""
    dims = {}
    for spec in specs:
        m = re.fullmatch(r"([^=]+)=(\d+)", spec)
        if not m:
            raise ValueError(f"--dim {spec!r}: expected NAME=SIZE, e.g. --dim batch=4")
        dims[m[1]] = int(m[2])
    return dims


def onnx_inputs(value_infos: list[Any], dtypes: list[Any], dims: dict[str, int]) -> list[Any]:
    """Random inputs (seed 0) of the declared shapes; a symbolic dim takes its size from `dims`."""
    import torch

    from autofusion.frontend.onnx import input_dims

    gen = torch.Generator().manual_seed(0)
    out = []
    for vi, dtype in zip(value_infos, dtypes, strict=True):
        shape = []
        for k, d in enumerate(input_dims(vi)):
            if isinstance(d, int):
                shape.append(d)
            elif isinstance(d, str) and d in dims:
                shape.append(dims[d])
            else:
                hint = f"--dim {d}=SIZE" if isinstance(d, str) else "a model with a static shape"
                raise ValueError(f"input {vi.name!r} dim {k} is dynamic ({d!r}); give its size with {hint}")
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:  # indices: small values are valid for any gathered dim
            out.append(torch.randint(0, 2, shape, generator=gen).to(dtype))
    return out


def _load_onnx(spec: str, dims: dict[str, int]) -> tuple[Any, tuple[Any, ...]]:
    from autofusion.frontend.onnx import graph_inputs
    from autofusion.frontend.onnx import load_model as read_onnx
    from autofusion.frontend.onnx.context import dtype_of

    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"MODEL {spec!r}: no such file")
    proto, _label = read_onnx(path)  # a bad file raises the frontend's CompilerError, naming the file
    vis = graph_inputs(proto)
    dtypes = [dtype_of(vi.type.tensor_type.elem_type, f"input {vi.name!r}").to_torch() for vi in vis]
    return path, tuple(onnx_inputs(vis, dtypes, dims))


def load_model(spec: str, dims: dict[str, int] | None = None) -> tuple[Any, tuple[Any, ...]]:
    if spec.startswith("builtin:"):
        from autofusion.tools.models import builtin

        return builtin(spec.removeprefix("builtin:"))
    if is_onnx_spec(spec):
        return _load_onnx(spec, dims or {})
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ValueError(f"MODEL {spec!r}: expected {FORMS}")
    try:
        module = importlib.import_module(kind)
    except ImportError as e:
        raise ValueError(f"MODEL {spec!r}: cannot import module {kind!r}: {e}") from e
    factory = getattr(module, rest, None)
    if not callable(factory):
        raise ValueError(f"MODEL {spec!r}: module {kind!r} has no callable {rest!r}")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise ValueError(
            f"MODEL {spec!r}: {rest}() must return (model, example_inputs), got {type(made).__name__}"
        )
    model, inputs = made
    return model, tuple(inputs)
