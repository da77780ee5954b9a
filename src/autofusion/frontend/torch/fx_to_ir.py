"""ATen-level torch.fx graph -> IR graph.

In: an exported program's graph (functional ATen, high-level ops kept; see `capture.py`) and the role
of each placeholder. Out: a verified `Graph` plus what the caller needs to run it (`Conversion`).

The loop is the frontends' one driver (`frontend/driver.py`); this module says how an FX graph is
walked. Each call_function node goes to the converter registered for its op packet. When there is
none, or the converter declines (`UnsupportedOpError`), or its result disagrees with the types torch
recorded, whatever it added is rolled back and the call becomes an `extern` node that runs the ATen
op as is. Each fallback is logged once per compile at INFO (`Fallback aten.<op>(...) # reason: ...`)
and a summary of lowered and fallen-back ops closes every conversion.
"""

from __future__ import annotations

import logging
import operator
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

import autofusion.frontend.torch.converters  # noqa: F401  (registers converters)
from autofusion.errors import FrontendError, UnsupportedOpError
from autofusion.frontend.driver import Conversion, Step, drive
from autofusion.frontend.torch import symbols
from autofusion.frontend.torch.context import CONVERTERS, TV, ConvCtx
from autofusion.ir.dtypes import DType, UnsupportedDTypeError
from autofusion.ir.graph import Arg, GraphBuilder, InputRole
from autofusion.ir.scope import NO_SCOPE, Scope
from autofusion.ir.types import TensorType

log = logging.getLogger(__name__)

# Calls that only assert facts torch already checked while tracing; they produce nothing we run.
_ASSERTS = {
    "_assert_tensor_metadata",
    "_assert_scalar",
    "sym_constrain_range_for_size",
    "sym_constrain_range",
    "_assert_async",
    "_functional_assert_async",
}


def tensor_type(val: Any, keep_strides: bool = False) -> TensorType:
    if not isinstance(val, torch.Tensor):
        raise FrontendError(f"expected a tensor, got {type(val).__name__}")
    try:
        # A symbolic size is a SymInt while a symbolic capture names torch's symbols (`symbols.py`).
        shape = tuple(symbols.size(s) for s in val.shape)
        strides = tuple(symbols.size(s) for s in val.stride()) if keep_strides else ()
    except (TypeError, RuntimeError) as e:
        raise FrontendError(f"dynamic (symbolic) shape {tuple(val.shape)}: {e}") from None
    return TensorType(DType.from_torch(val.dtype), shape, strides)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def source_loc(node: torch.fx.Node) -> str | None:
    """The innermost user frame in the node's stack trace: 'model.py:12 in forward'."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = list(_FRAME.finditer(trace))
    if not frames:
        return None
    # Non-strict export records frames inside torch itself (nn.Embedding.forward -> F.embedding); the user
    # wants the line of their model that called it, so skip frames under the torch package.
    user = [m for m in frames if not m["file"].startswith(_TORCH_DIR)]
    m = (user or frames)[-1]
    return f"{m['file']}:{m['line']} in {m['fn']}"


def _describe(x: Any) -> str:
    if isinstance(x, torch.fx.Node):
        val = x.meta.get("val")
        if isinstance(val, torch.Tensor):
            try:
                return str(tensor_type(val))
            except (FrontendError, UnsupportedDTypeError):
                return str(val.dtype).removeprefix("torch.")
        return x.name
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_describe(i) for i in x) + "]"
    return repr(x)


def _opaque_dtype(node: torch.fx.Node, expected: tuple[TensorType | None, ...]) -> DType | None:
    """The first opaque dtype (complex, wide unsigned, float8, quantized) among the call's tensor
    inputs and outputs, or None."""
    for t in expected:
        if t is not None and t.dtype.is_opaque:
            return t.dtype
    for x in node.all_input_nodes:
        for v in pytree.tree_leaves(x.meta.get("val")):
            if isinstance(v, torch.Tensor) and (d := DType.from_torch(v.dtype)).is_opaque:
                return d
    return None


def bind_schema(target: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Arguments by the op schema's own parameter names, defaults filled in."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(target._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            raise UnsupportedOpError(f"argument {arg.name!r} missing from the call")
    return out


def target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        ns, name = target._schema.name.split("::")
        return f"{ns}.{name}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


class _Walk:
    """The FX graph as the driver walks it (`frontend.driver.Walk`)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        name: str,
        roles: dict[str, InputRole],
        constants: dict[str, torch.Tensor],
        user_strides: dict[str, tuple[int, ...]] | None,
    ) -> None:
        self.gm = gm
        self.builder = self.b = GraphBuilder(name)
        self.log = log
        self.roles, self.constants, self.user_strides = roles, constants, user_strides
        self.env: dict[torch.fx.Node, Any] = {}

    def begin(self) -> list[str]:
        placeholders: list[str] = []
        for node in self.gm.graph.nodes:
            if node.op != "placeholder":
                continue
            if node.name in self.constants:
                const = self.constants[node.name]
                vid = self.b.add_constant(node.name, const, tensor_type(const))
                self.env[node] = TV(vid, self.b.type_of(vid))
                continue
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise FrontendError(f"input {node.name} is a {type(val).__name__}, not a tensor")
            t = tensor_type(val)
            if self.user_strides and node.name in self.user_strides:
                t = TensorType(t.dtype, t.shape, self.user_strides[node.name])
            vid = self.b.add_input(t, node.name, self.roles.get(node.name, InputRole.USER))
            self.env[node] = TV(vid, t)
            placeholders.append(node.name)
        return placeholders

    def nodes(self) -> Iterator[torch.fx.Node]:
        for node in self.gm.graph.nodes:
            if node.op == "call_function":
                self.b.scope = Scope.from_meta(node.meta)  # every IR node of this call carries it
                yield node
                self.b.scope = NO_SCOPE
            elif node.op not in ("placeholder", "output"):
                raise FrontendError(f"unsupported fx node kind {node.op} ({node.name})")

    def rollback(self, mark: tuple[int, int]) -> None:
        self.b.rollback(mark)

    def finish(self) -> tuple[list[int], list[tuple[str, Any]], list[str]]:
        output_leaves: list[tuple[str, Any]] = []
        outputs: list[int] = []
        names: list[str] = []
        node = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        for leaf in pytree.tree_leaves(node.args[0]):
            if isinstance(leaf, torch.fx.Node):
                v = self.env.get(leaf)
                if not isinstance(v, TV):
                    raise FrontendError(f"output {leaf.name} was not converted to a tensor")
                output_leaves.append(("value", len(outputs)))
                outputs.append(v.id)
                names.append(leaf.name)
            else:
                output_leaves.append(("literal", leaf))
        return outputs, output_leaves, names

    def expected_types(self, node: torch.fx.Node) -> tuple[TensorType | None, ...]:
        val = node.meta.get("val")
        leaves = val if isinstance(val, (list, tuple)) else (val,)
        return tuple(tensor_type(v) if isinstance(v, torch.Tensor) else None for v in leaves)

    def to_tv(self, x: Any) -> Any:
        if isinstance(x, torch.fx.Node):
            v = self.env[x]
            if v is None:
                raise FrontendError(f"{x.name} has no converted value")
            return v
        if isinstance(x, (list, tuple)):
            return type(x)(self.to_tv(i) for i in x)
        return x

    def plan(self, node: torch.fx.Node) -> Step[torch.fx.Node] | None:
        target = node.target
        if isinstance(node.meta.get("val"), torch.SymInt) and symbols.active():
            # A size computed from the input sizes (`aten.sym_size.int`, `operator.mul` on sizes): the
            # converters read it as the SymInt of its expression.
            self.env[node] = symbols.size(node.meta["val"])
            return None
        if target is operator.getitem:
            src, index = node.args[0], node.args[1]
            if not isinstance(src, torch.fx.Node) or not isinstance(index, int):
                raise FrontendError(
                    f"node {node.name} indexes {src} with {index!r}, not a node's output by position"
                )
            self.env[node] = self.env[src][index]
            return None
        tname = target_name(target)
        if not isinstance(target, torch._ops.OpOverload):
            raise FrontendError(f"cannot convert Python call {tname} in node {node.name}")
        ns, packet = target._schema.name.split("::")
        if packet in _ASSERTS:
            return None
        expected = self.expected_types(node)
        reason = "no converter" if ns != "aten" or packet not in CONVERTERS else ""
        opaque = _opaque_dtype(node, expected)
        if opaque is not None:  # no IR op computes on it: torch runs the op, the IR carries the value
            reason = f"dtype {opaque.name} has no IR equivalent"

        def lower() -> None:
            self.env[node] = self._convert(node, target, packet, expected)

        def extern(why: str) -> str:
            self._extern(node, tname, why)
            return ", ".join(_describe(a) for a in node.args)

        return Step(tname, None if reason else lower, reason, extern)

    def _convert(
        self,
        node: torch.fx.Node,
        target: torch._ops.OpOverload,
        packet: str,
        expected: tuple[TensorType | None, ...],
    ) -> Any:
        kwargs = {k: self.to_tv(v) for k, v in bind_schema(target, node.args, node.kwargs).items()}
        ctx = ConvCtx(self.b, packet, target._overloadname, expected, node.name, source_loc(node))
        result = CONVERTERS[packet](ctx, kwargs)
        got = result if isinstance(result, tuple) else (result,)
        if isinstance(node.meta.get("val"), (list, tuple)):
            used = {u.args[1] for u in node.users if u.target is operator.getitem}
            if len(got) != len(expected) or any(not isinstance(i, int) or got[i] is None for i in used):
                raise UnsupportedOpError("outputs used downstream were not converted")
        elif not isinstance(result, TV):
            raise UnsupportedOpError("converter returned several outputs for a single-output op")
        for g, e in zip(got, expected, strict=True):  # lengths checked above (one each, or compared)
            if g is not None and e is not None and (g.shape != e.shape or g.dtype != e.dtype):
                raise UnsupportedOpError(f"converted to {g.type} but torch computes {e}")
        return result

    def _extern(self, node: torch.fx.Node, tname: str, reason: str) -> None:
        tensors: list[int] = []

        def template(x: Any) -> Any:
            if isinstance(x, torch.fx.Node):
                v = self.to_tv(x)
                if not isinstance(v, TV):
                    raise FrontendError(f"{node.name}: argument {x.name} is not a single tensor")
                if v.id not in tensors:
                    tensors.append(v.id)
                return Arg(tensors.index(v.id))
            if isinstance(x, (list, tuple)):
                return tuple(template(i) for i in x)
            return x

        args = template(node.args)
        kwargs = tuple(sorted((k, template(v)) for k, v in node.kwargs.items()))
        val = node.meta.get("val")
        leaves = [v for v in pytree.tree_leaves(val)]
        if not all(isinstance(v, torch.Tensor) for v in leaves):
            raise FrontendError(
                f"{tname} in node {node.name} returns non-tensor values; cannot run it as an extern"
            )
        out_types = tuple(tensor_type(v) for v in leaves)
        outs = self.b.add_node(
            "extern", tensors,
            {"target": tname, "args": args, "kwargs": kwargs, "out_types": out_types, "reason": reason},
            name=node.name, loc=source_loc(node),
        )  # fmt: skip
        tvs = tuple(TV(o, self.b.type_of(o)) for o in outs)
        self.env[node] = tvs[0] if isinstance(val, torch.Tensor) else tvs


def convert_graph(
    gm: torch.fx.GraphModule,
    roles: dict[str, InputRole],
    constants: dict[str, torch.Tensor],
    name: str = "forward",
    user_strides: dict[str, tuple[int, ...]] | None = None,
) -> Conversion:
    """Convert `gm` (functional ATen). `roles` names each placeholder's role; placeholders listed in
    `constants` become `const` nodes holding that tensor instead of inputs."""
    return drive(_Walk(gm, name, roles, constants, user_strides))
