"""`LiveTensor`: a model's parameter or buffer, read by name on every call of a compiled graph.

Made by capture (`capture.py`) and by `autofusion.load` for a package whose weights are the model's;
here, apart from capture, so that running a loaded package does not import torch.export.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

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


class Fetch:
    """`[r.get() for r in refs]` in one call (`fetcher`). Calling it checks the values are tensors;
    `unchecked` leaves that out, for a caller that proves it another way (a `runtime.stamp.Stamp`
    finding the very tensors of a checked call) and passes anything else through `check`."""

    __slots__ = ("check", "unchecked")

    def __init__(self, unchecked: Callable[[], list[Any]], check: Callable[[list[Any]], list[torch.Tensor]]):
        self.unchecked, self.check = unchecked, check

    def __call__(self) -> list[torch.Tensor]:
        return self.check(self.unchecked())


def fetcher(refs: Sequence[Any]) -> Fetch:
    """One call returning `[r.get() for r in refs]`: the `LiveTensor`s' lookups as one generated
    function, each module on their paths read once (21 parameters of a decode step: ~3 us, where the
    separate lookups take ~10 us on the development VM). The same dict reads as `LiveTensor.get`, so
    a parameter re-assigned or a module replaced is what the next call reads; where one fails (a name
    gone from the dicts, a submodule set to None, a value not a tensor) the separate lookups run
    again and give their result or their error. Other objects with a `get` (a loaded package's weights)
    are called as they are."""
    lines: list[str] = []
    names: dict[tuple[int, tuple[str, ...]], str] = {}  # (root, path) -> the local holding that module
    env: dict[str, Any] = {}
    items: list[str] = []
    for k, r in enumerate(refs):
        if type(r) is not LiveTensor:
            env[f"g{k}"] = r.get
            items.append(f"g{k}()")
            continue
        key: tuple[int, tuple[str, ...]] = (id(r.root), ())
        if key not in names:
            names[key] = f"m{len(names)}"
            env[names[key]] = r.root
        for depth in range(1, len(r.path) + 1):
            sub = (id(r.root), r.path[:depth])
            if sub not in names:
                names[sub] = f"m{len(names)}"
                lines.append(f"    {names[sub]} = {names[(id(r.root), r.path[: depth - 1])]}._modules"
                             f"[{r.path[depth - 1]!r}]")  # fmt: skip
        items.append(f"{names[(id(r.root), r.path)]}.{r.store}[{r.attr!r}]")
    roots = [n for (_, path), n in names.items() if not path]
    src = "\n".join([f"def fetch({', '.join(roots)}):", *lines, f"    return [{', '.join(items)}]"])
    scope: dict[str, Any] = {k: v for k, v in env.items() if k.startswith("g")}
    exec(compile(src, "<autofusion.live.fetcher>", "exec"), scope)  # our own source, built above
    fetch = scope["fetch"]
    args = [env[n] for n in roots]
    slow = [r.get for r in refs]
    is_tensor = [torch.Tensor] * len(refs)

    def unchecked() -> list[Any]:
        try:
            out: list[Any] = fetch(*args)
        except (KeyError, AttributeError):
            return [get() for get in slow]
        return out

    def check(out: list[Any]) -> list[torch.Tensor]:
        return out if all(map(isinstance, out, is_tensor)) else [get() for get in slow]

    return Fetch(unchecked, check)
