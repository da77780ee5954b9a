"""The oneDNN convolutions inside SuperKernel entries: their primitive handles, current at every call.

In: a `SuperPlan` whose entries call "dnnl_conv" members (plan/entry_conv.py) and, per call, the values
the executor holds (graph inputs, folded parameters, constants). Out: `DnnlHandles`, the entry's
library pointer array F (plan/superkernel.py says its layout) with the glue's execute function, an error
buffer and one primitive handle per member, and `refresh`, which makes those handles match the
parameters as they are now; `check`, which raises what a failing member wrote.

Handles: made as the "dnnl" route makes them outside an entry (library.dnnl_primitive: once per input
shape and parameter version, the weights folded and reordered into the primitive), so a parameter
changed in place, re-assigned or re-folded between calls gets a new primitive, never a stale one. The
per-call check is one pass over the members' parameter tensors (identity, address, version) against
those the handles were made from; they are held here until the next refresh, so an identity cannot be
reused by another tensor in between.
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from autofusion.errors import ExecutionError
from autofusion.plan.schedule import OpStep
from autofusion.plan.superkernel import DNNL_ERR_LEN, DNNL_FIRST_HANDLE, SuperPlan, dnnl_handles
from autofusion.runtime import dnnl_route, library

if TYPE_CHECKING:
    from autofusion.plan.entry_conv import ConvArgs


class DnnlHandles:
    """F for a plan's entries; `made` counts the primitives fetched (a refresh after a change)."""

    def __init__(self, splan: SuperPlan, gemm: int | None) -> None:
        self.index = dnnl_handles(splan)
        self.fptrs = (ctypes.c_void_p * (DNNL_FIRST_HANDLE + len(self.index)))()
        self.fptrs[0] = gemm or 0
        self.err = ctypes.create_string_buffer(DNNL_ERR_LEN)
        self.made = 0
        types = splan.plan.graph.value_types()
        self._members: list[tuple[int, ConvArgs, tuple[int, ...], torch.dtype, str]] = []
        if self.index:  # entries without convolutions (most) need not import the conv records
            from autofusion.plan.entry_conv import conv_args
        for m, f in self.index.items():
            step = splan.plan.steps[m]
            assert isinstance(step, OpStep)
            c = conv_args(step.node)
            assert c is not None
            x = types[c.x]
            self._members.append((f, c, x.shape, x.dtype.to_torch(), step.node.name))
        if self._members:
            glue = dnnl_route.glue()
            if glue is None:
                raise ExecutionError("the SuperKernel calls oneDNN convolutions but the dnnl glue is "
                                     "unavailable here")  # fmt: skip
            self.fptrs[1] = ctypes.cast(glue.execute, ctypes.c_void_p).value
            self.fptrs[2] = ctypes.addressof(self.err)
        # Every member's parameter values, flat, and the tensors the handles were made from.
        self._ids = [v for _, c, _, _, _ in self._members for v in c.params if v is not None]
        self._srcs: list[torch.Tensor] = []
        self._stamp: list[tuple[int, int]] = []
        self._prims: list[object] = []  # the handles' owners: a handle lives as long as its primitive

    def __bool__(self) -> bool:
        return bool(self._members)

    @property
    def param_values(self) -> list[int]:
        """The value ids of every member's parameters (what `refresh` reads from the values)."""
        return list(self._ids)

    def refresh(self, env: Mapping[int, torch.Tensor]) -> None:
        srcs = [env[v] for v in self._ids]
        if len(srcs) == len(self._srcs) and all(map(operator.is_, srcs, self._srcs)):
            try:
                stamp = [(t.data_ptr(), t._version) for t in srcs]
            except RuntimeError:  # an inference tensor has no version counter (library._version)
                stamp = [(t.data_ptr(), library._version(t)) for t in srcs]
            if stamp == self._stamp:
                return
        prims: list[object] = []
        for f, c, shape, dtype, name in self._members:
            p = [None if v is None else env[v] for v in c.params]
            assert p[0] is not None
            prim = library.dnnl_primitive(shape, dtype, p[0], p[1], p[2], p[3], p[4], p[5],
                                          c.other is not None, c.eps, list(c.stride), list(c.padding),
                                          list(c.dilation), c.groups, c.act, c.pre_pad)  # fmt: skip
            if prim is None:
                raise ExecutionError(f"{name}: oneDNN declined the convolution the SuperKernel was built "
                                     "to call")  # fmt: skip
            prims.append(prim)
            self.fptrs[f] = prim.handle
        self.made += len(prims)
        self._prims, self._srcs = prims, srcs
        self._stamp = [(t.data_ptr(), library._version(t)) for t in srcs]

    def check(self) -> None:
        """Raise the reason a member's oneDNN call failed in the last entry call (and clear it)."""
        if self.err.value:
            what = self.err.value.decode(errors="replace")
            self.err.value = b""
            raise ExecutionError(f"a oneDNN convolution inside a SuperKernel failed: {what}")
