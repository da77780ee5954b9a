"""The immutable graph: a flat SSA list of nodes in topological order (like a jaxpr).

In: values and nodes built with `GraphBuilder`. Out: a frozen `Graph`.

Invariants (checked by `autofusion.ir.verify`):
- every value id is defined exactly once: as a graph input or as one node output;
- a node only uses values defined before it (the node list is a topological order);
- each node's declared output types equal what its op's inference computes from its inputs.
Passes never edit a graph: they build a new one (`Graph.replace`, or a fresh `GraphBuilder`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from autofusion.ir import catalog as _catalog  # noqa: F401  (registers the op catalogue)
from autofusion.ir.ops import Op, get_op, infer_types
from autofusion.ir.scope import NO_SCOPE, Scope
from autofusion.ir.types import TensorType


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value: its id and type."""

    id: int
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.id}"


class Arg:
    """Marks tensor input `index` inside an extern node's literal argument template."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Arg) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("Arg", self.index))

    def __repr__(self) -> str:
        return f"${self.index}"


class InputRole(enum.Enum):
    USER = "user"  # passed by the caller on every call
    PARAM = "param"  # a module parameter, bound by the compiled callable
    BUFFER = "buffer"  # a module buffer (e.g. batch-norm running stats), bound by the compiled callable


@dataclass(frozen=True, slots=True)
class GraphInput:
    """A graph input: its value, name and role."""

    value: Value
    name: str
    role: InputRole = InputRole.USER


@dataclass(frozen=True, slots=True)
class Node:
    """One operation: its op, input value ids, output values and attributes."""

    # Always an `Op` (a StrEnum: `node.op == "add"` holds); a plain string is converted on construction.
    op: Op
    inputs: tuple[int, ...]
    outputs: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    name: str = ""
    # Where the node came from in the user's code ("model.py:12 in forward"), for errors and reports.
    loc: str | None = None
    # The SuperKernel scope the user put around the op (`autofusion.super_kernel_scope`), see Scope.
    scope: Scope = NO_SCOPE

    def __post_init__(self) -> None:
        if type(self.op) is not Op:
            # A frozen dataclass sets fields through object.__setattr__; this is its one normalisation.
            object.__setattr__(self, "op", Op.parse(self.op, f"node {self.name!r}"))

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return get_op(self.op).optional_attrs.get(key, default)

    @property
    def attr_dict(self) -> dict[str, Any]:
        return get_op(self.op).with_defaults(dict(self.attrs))

    @property
    def out(self) -> Value:
        """The single output; raises for multi-output nodes so callers cannot silently drop outputs."""
        if len(self.outputs) != 1:
            raise ValueError(f"node {self.name} ({self.op}) has {len(self.outputs)} outputs")
        return self.outputs[0]

    def replace(self, **changes: Any) -> Node:
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self
        return dataclasses.replace(self, **changes)


def freeze_attrs(attrs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, _freeze(v)) for k, v in attrs.items()))


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


# weakref_slot: `ir.analysis` caches use-def facts per graph object and lets them go with the graph.
@dataclass(frozen=True, slots=True, weakref_slot=True)
class Graph:
    """A typed, immutable graph: inputs, nodes in topological order, outputs and constants."""

    inputs: tuple[GraphInput, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    # Tensor constants referenced by `const` nodes. Treated as read-only.
    constants: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    name: str = "forward"

    def replace(self, **changes: Any) -> Graph:
        return dataclasses.replace(self, **changes)

    # A fresh dict per call (callers may extend it). Use-def maps, and a read-only cached copy of
    # this one, are in `ir.analysis`: cached beside the graph, not inside it, so the object stays frozen.
    def value_types(self) -> dict[int, TensorType]:
        types = {i.value.id: i.value.type for i in self.inputs}
        for n in self.nodes:
            for v in n.outputs:
                types[v.id] = v.type
        return types

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            key = n.attr("target") if n.op == "extern" else n.op
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        from autofusion.ir.printer import print_graph

        return print_graph(self)


class GraphBuilder:
    """Appends nodes in order, inferring and checking their output types as it goes."""

    def __init__(self, name: str = "forward") -> None:
        self.name = name
        self._inputs: list[GraphInput] = []
        self._nodes: list[Node] = []
        self._types: dict[int, TensorType] = {}
        self._constants: dict[str, Any] = {}
        self._next_id = 0
        self._names: set[str] = set()
        self._suffix: dict[str, int] = {}
        self._producer: dict[int, Node] = {}
        # Scope mark given to every node added from now on (frontends and passes set it per source node).
        self.scope: Scope = NO_SCOPE

    def _new_value(self, t: TensorType) -> Value:
        v = Value(self._next_id, t)
        self._next_id += 1
        self._types[v.id] = t
        return v

    def unique_name(self, base: str) -> str:
        name = base
        if name in self._names:
            # The next suffix to try per base name keeps this O(1) with 100k nodes named "add".
            k = self._suffix.get(base, 1)
            while f"{base}_{k}" in self._names:
                k += 1
            name = f"{base}_{k}"
            self._suffix[base] = k + 1
        self._names.add(name)
        return name

    def mark(self) -> tuple[int, int]:
        """A point `rollback` can return to (used when a converter gives up half way)."""
        return len(self._nodes), self._next_id

    def rollback(self, mark: tuple[int, int]) -> None:
        n_nodes, next_id = mark
        for node in self._nodes[n_nodes:]:
            self._names.discard(node.name)
        del self._nodes[n_nodes:]
        for vid in range(next_id, self._next_id):
            self._types.pop(vid, None)
            self._producer.pop(vid, None)
        self._next_id = next_id

    def type_of(self, vid: int) -> TensorType:
        return self._types[vid]

    def producer(self, vid: int) -> Node | None:
        """The node that defines `vid` so far, or None for a graph input (rewriting passes look back)."""
        return self._producer.get(vid)

    def add_input(self, t: TensorType, name: str, role: InputRole = InputRole.USER) -> int:
        v = self._new_value(t)
        self._inputs.append(GraphInput(v, self.unique_name(name), role))
        return v.id

    def add_constant(self, name: str, tensor: Any, t: TensorType) -> int:
        key = self.unique_name(name)
        self._constants[key] = tensor
        return self.add("const", (), {"name": key, "type": t}, name=key)

    def add_node(
        self,
        op: str,
        inputs: Iterable[int],
        attrs: Mapping[str, Any] | None = None,
        *,
        name: str = "",
        loc: str | None = None,
        out_types: tuple[TensorType, ...] | None = None,
    ) -> tuple[int, ...]:
        """Append a node; returns its output value ids. Raises ShapeInferenceError on bad inputs and
        IRVerifyError on an op the registry does not know."""
        kind = Op.parse(op, f"node {name or op!r}")
        ins = tuple(inputs)
        frozen = freeze_attrs(attrs or {})
        inferred = infer_types(op, tuple(self._types[i] for i in ins), dict(frozen))
        if out_types is not None and out_types != inferred:
            from autofusion.errors import ShapeInferenceError

            raise ShapeInferenceError(
                f"{op}: inferred {', '.join(map(str, inferred))} "
                f"but expected {', '.join(map(str, out_types))}"
            )
        outs = tuple(self._new_value(t) for t in inferred)
        node = Node(kind, ins, outs, frozen, self.unique_name(name or op), loc, self.scope)
        self._nodes.append(node)
        for v in outs:
            self._producer[v.id] = node
        return tuple(v.id for v in outs)

    def copy(self, node: Node, inputs: Iterable[int], constants: Mapping[str, Any]) -> tuple[int, ...]:
        """`node` of another graph appended unchanged but for its inputs (`inputs`: ids of this builder);
        a `const` node brings its tensor from `constants` (that graph's). Returns the new output ids."""
        if node.op == "const":
            key = node.attr("name")
            return (self.add_constant(key, constants[key], node.attr("type")),)
        return self.add_node(node.op, inputs, dict(node.attrs), name=node.name, loc=node.loc)

    def add_extern(
        self,
        target: str,
        tensors: Iterable[int | None],
        literals: tuple[Any, ...],
        out_types: tuple[TensorType, ...],
        *,
        reason: str,
        name: str = "",
        loc: str | None = None,
    ) -> tuple[int, ...]:
        """A call of the torch operator `target` ("ns.op.overload"): `tensors` are its leading arguments
        (value ids, None for an absent optional), `literals` the rest; each distinct tensor is one input."""
        ins: list[int] = []
        template: list[Any] = []
        for t in tensors:
            if t is None:
                template.append(None)
            else:
                if t not in ins:
                    ins.append(t)
                template.append(Arg(ins.index(t)))
        attrs = {
            "target": target,
            "args": tuple(template) + literals,
            "kwargs": (),
            "out_types": out_types,
            "reason": reason,
        }
        return self.add_node("extern", ins, attrs, name=name, loc=loc)

    def add(self, op: str, inputs: Iterable[int], attrs: Mapping[str, Any] | None = None, **kw: Any) -> int:
        """`add_node` for single-output ops."""
        outs = self.add_node(op, inputs, attrs, **kw)
        if len(outs) != 1:
            raise ValueError(f"{op} has {len(outs)} outputs; use add_node")
        return outs[0]

    def build(self, outputs: Iterable[int]) -> Graph:
        return Graph(
            tuple(self._inputs),
            tuple(self._nodes),
            tuple(outputs),
            MappingProxyType(dict(self._constants)),
            self.name,
        )
