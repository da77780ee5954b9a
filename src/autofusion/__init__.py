"""autofusion: an operator-fusion compiler for PyTorch and ONNX inference graphs.

Public API:
- `compile(model, example_inputs=None, **options)` -> a callable with `.graph` (IR) and `.stats`;
- `torch.compile(model, backend="autofusion")` (entry point; `autofusion.backend.autofusion_backend`);
- `builtin(name)` -> (module, example_inputs) for the built-in models;
- `super_kernel_scope(name, options="")`: a context manager marking model code as one SuperKernel.
"""

from autofusion._version import __version__ as __version__
from autofusion.api import CompiledModel, compile
from autofusion.backend import autofusion_backend
from autofusion.config import Options
from autofusion.errors import CompilerError
from autofusion.scope import SuperKernelOptions, super_kernel_scope


def builtin(name: str, **kwargs):  # type: ignore[no-untyped-def]
    """(module, example_inputs) for a built-in model; see `autofusion.models.builtins`."""
    from autofusion.models.builtins import builtin as _builtin

    return _builtin(name, **kwargs)


__all__ = ["CompiledModel", "CompilerError", "Options", "SuperKernelOptions", "autofusion_backend", "builtin", "compile",
           "super_kernel_scope"]
