"""`LiveTensor`: a model's parameter or buffer, read by name on every call of a compiled graph.

Made by capture (`capture.py`) and by `autofusion.load` for a package whose weights are the model's;
here, apart from capture, so that running a loaded package does not import torch.export.
"""

from __future__ import annotations

import operator

import torch

from autofusion.errors import FrontendError


class LiveTensor:
    """A parameter or buffer of a module, looked up by its name on every call.

    The lookup walks the modules' own dicts (`_modules`, `_parameters`, `_buffers`): a few dict reads,
    where `getattr` would run `nn.Module.__getattr__` for each part. A name that is no longer in those
    dicts (deleted and set as a plain attribute) is looked up with getattr."""

    __slots__ = ("attr", "path", "root", "store", "target")

    def __init__(self, root: torch.nn.Module, target: str, is_buffer: bool) -> None:
        *path, attr = target.split(".")
        self.root, self.path, self.attr, self.target = root, tuple(path), attr, target
        self.store = "_buffers" if is_buffer else "_parameters"

    def get(self) -> torch.Tensor:
        try:
            m = self.root
            for p in self.path:
                child = m._modules[p]
                if child is None:  # a submodule set to None: the attribute path below reports it
                    raise KeyError(p)
                m = child
            t = getattr(m, self.store)[self.attr]
        except (KeyError, AttributeError):
            try:
                t = operator.attrgetter(self.target)(self.root)
            except AttributeError:  # a module on the path was deleted or replaced by a non-module
                raise FrontendError(
                    f"the model no longer has {self.target}; compile the model again"
                ) from None
        if not isinstance(t, torch.Tensor):
            raise FrontendError(f"the model's {self.target} is now a {type(t).__name__}, not a tensor; "
                                "compile the model again")  # fmt: skip
        return t
