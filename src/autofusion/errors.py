"""The single exception hierarchy.

Every error the compiler raises on purpose is a `CompilerError`; where a built-in type fits, the class
also derives from it (JAX does the same), so `except TypeError` in user code keeps working.
Messages name the node at fault, the IR around it and, when known, the user's source line.
"""

from __future__ import annotations


class CompilerError(Exception):
    """Root of all autofusion errors."""


class FrontendError(CompilerError):
    """The model could not be captured or converted (named as the source model calls it)."""


class UnsupportedOpError(FrontendError, NotImplementedError):
    """An op has no converter; the frontend turns it into an extern call instead of raising."""


class ModelFileError(FrontendError, ValueError):
    """A model file cannot be read: malformed or truncated, an unsupported opset, missing external data."""


class IRVerifyError(CompilerError, ValueError):
    """A graph broke an IR invariant; the message shows the IR around the fault."""


class ShapeInferenceError(CompilerError, ValueError):
    """An op was given inputs or attributes whose shapes or dtypes it cannot take."""


class RewriteError(CompilerError):
    """A rewrite rule or pass failed; wrapped with the pass name and the passes before it."""


class FusionError(CompilerError):
    """A fusion plan could not be built."""


class CodegenError(CompilerError):
    """Source could not be generated for a kernel."""


class ExportError(CompilerError):
    """A graph or plan cannot be written as ONNX; names the IR node that has no ONNX form."""


class BuildError(CompilerError):
    """The system compiler failed; carries the source path, the command and its stderr."""

    def __init__(self, message: str, source_path: str = "", command: str = "", stderr: str = ""):
        super().__init__(message)
        self.source_path = source_path
        self.command = command
        self.stderr = stderr


class ExecutionError(CompilerError, RuntimeError):
    """Running a compiled graph failed; names the node and the user's source line."""


class InputMismatchError(CompilerError, TypeError):
    """A compiled callable was given the wrong number or kinds of inputs."""


class RuleFileError(CompilerError, ValueError):
    """A rule, blacklist, skip-list or switch file is malformed; the message starts with file:line."""


class PackageError(CompilerError, ValueError):
    """A saved package cannot be written or loaded here (another CPU, version or format; a call with a
    signature it does not hold and no model or compiler to compile one); the message says what to do."""
