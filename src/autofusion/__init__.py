"""autofusion: an operator-fusion compiler for PyTorch and ONNX inference graphs.

Public API:
- `compile(model, example_inputs=None, **options)` -> a callable with `.graph` (IR) and `.stats`;
- `torch.compile(model, backend="autofusion")` (entry point; `autofusion.backend.autofusion_backend`);
- `builtin(name)` -> (module, example_inputs) for the built-in models;
- `super_kernel_scope(name, options="")`: a context manager marking model code as one SuperKernel;
- `save(compiled, path, weights="reference"|"copy")` and `load(path, model=None)`: a compiled model as
  one file, loaded in another process with no capture and no compiler (`autofusion.package`).

Names load on first use, so `import autofusion.ir` (or `autofusion --help`) does not load the compiler.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autofusion._version import __version__ as __version__

if TYPE_CHECKING:
    from autofusion.api import CompiledModel, compile
    from autofusion.backend import autofusion_backend
    from autofusion.config import Options
    from autofusion.errors import CompilerError
    from autofusion.frontend.torch.scope import super_kernel_scope
    from autofusion.ir.scope import SuperKernelOptions
    from autofusion.package import load, save
    from autofusion.tools.models import builtin

# public name -> the module that defines it
_EXPORTS = {
    "CompiledModel": "autofusion.api",
    "compile": "autofusion.api",
    "autofusion_backend": "autofusion.backend",
    "Options": "autofusion.config",
    "CompilerError": "autofusion.errors",
    "SuperKernelOptions": "autofusion.ir.scope",
    "super_kernel_scope": "autofusion.frontend.torch.scope",
    "builtin": "autofusion.tools.models",
    "save": "autofusion.package",
    "load": "autofusion.package",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autofusion' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*_EXPORTS, "__version__"])


__all__ = [
    "CompiledModel",
    "CompilerError",
    "Options",
    "SuperKernelOptions",
    "__version__",
    "autofusion_backend",
    "builtin",
    "compile",
    "load",
    "save",
    "super_kernel_scope",
]
