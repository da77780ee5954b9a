"""Call arguments and results as a tree of containers over tensor leaves: flatten, key, rebuild.

Models are called with more than positional tensors: keyword arguments, flags (`use_cache=True`),
None, and objects that hold tensors (a transformers `StaticCache`); they return dataclasses,
`ModelOutput`s and cache objects. torch.export only takes and returns pytrees of registered types, so
capture exports a wrapper over the tensor leaves alone (`capture.py`), and this module turns
structures into leaves and back:

- `flatten(tree)` walks tuples, lists, dicts, types registered with torch's pytree (transformers
  registers every `ModelOutput`), and plain objects (their `__dict__`) that hold a tensor somewhere
  below. Everything else is a constant: it is part of the call's key (a call with another value
  compiles anew) and is passed as it was. The result is the tensors, the containers in preorder and a
  `Node` tree that is hashable and compares equal for calls with the same structure and constants.
- `rebuild(node, tensors)` makes the structure again around other tensors (fake ones while exporting):
  plain objects are made with `cls.__new__` and given a copy of the `__dict__`, registered types with
  their unflatten function. A container of the caller's arguments found again in the model's result
  (the cache object a decoder returns) is recorded as `Input(index)`, so the compiled model returns
  the caller's own object, as eager does.
"""

from __future__ import annotations

import functools
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as torch_pytree

from autofusion.errors import FrontendError

# Objects never walked into: they are constants by identity (a module or function passed as an argument).
_OPAQUE = (torch.nn.Module, type, types.FunctionType, types.MethodType, types.ModuleType,
           types.BuiltinFunctionType)  # fmt: skip
_MAX_DEPTH = 32


@dataclass(frozen=True, eq=False)
class Node:
    """One node of a structure. kind: "tensor" (meta: leaf index), "const" (meta: the value), "seq"
    (tuple, list, namedtuple), "map" (dict; meta: keys), "registered" (a torch pytree type; meta: its
    context), "object" (meta: attribute names), "ref" (meta: preorder index of a container met
    before), "input" (meta: preorder index of a container of the caller's arguments)."""

    kind: str
    type: type
    meta: Any = None
    children: tuple[Node, ...] = ()
    index: int = -1  # containers: their preorder position
    key: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.kind, self.type, _hashable(self.meta, self.kind),
                                         tuple(c.key for c in self.children)))  # fmt: skip

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and self.key == other.key

    @property
    def plain(self) -> bool:
        """A call tree (`call_tree`) of positional tensors and nothing else."""
        if self.kind != "seq" or self.type is not tuple or len(self.children) != 2:
            return False
        args, kwargs = self.children
        return (args.kind == "seq" and args.type is tuple and all(c.kind == "tensor" for c in args.children)
                and kwargs.kind == "const" and kwargs.meta == {})  # fmt: skip


class _Const:
    """A constant compared by identity (it has no hash of its own); holds the object so that its id is
    not reused while a key names it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Const) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _hashable(meta: Any, kind: str) -> Any:
    if kind != "const" and kind != "registered":
        return meta
    try:
        hash(meta)
    except TypeError:
        if isinstance(meta, (list, tuple)):
            return (type(meta), tuple(_hashable(m, kind) for m in meta))
        if type(meta) is dict and all(_plain_key(k) for k in meta):
            # by value, as lists are: an object that sets `self.x = {}` on every call (transformers'
            # caches do) would otherwise never match its last signature and recompile each call
            return (dict, tuple((k, _hashable(v, kind)) for k, v in meta.items()))
        return _Const(meta)
    # 1, 1.0 and True hash and compare equal: the type tells them apart
    return (type(meta), meta)


def _plain_key(k: Any) -> bool:
    return type(k) in (str, int, bool, float, type(None))


def _walkable(x: Any) -> bool:
    return hasattr(x, "__dict__") and not isinstance(x, _OPAQUE) and not isinstance(x, torch.Tensor)


class _Flattener:
    def __init__(self, inputs: dict[int, int] | None) -> None:
        self.tensors: list[torch.Tensor] = []
        self.containers: list[Any] = []
        self.seen: dict[int, int] = {}  # id of a container -> its preorder index
        self.inputs = inputs or {}  # id of a container of the call -> its index (results only)

    def container(self, x: Any) -> tuple[Node | None, int]:
        if id(x) in self.inputs:
            return Node("input", type(x), self.inputs[id(x)]), -1
        if id(x) in self.seen:
            return Node("ref", type(x), self.seen[id(x)]), -1
        index = len(self.containers)
        self.containers.append(x)
        self.seen[id(x)] = index
        return None, index

    def walk(self, x: Any, depth: int) -> Node:
        if depth > _MAX_DEPTH:
            raise FrontendError(f"arguments nested deeper than {_MAX_DEPTH} levels")
        if isinstance(x, np.ndarray):  # wrapped, not copied: the model is given a tensor, as before
            x = torch.from_numpy(x)
        if isinstance(x, torch.Tensor):
            self.tensors.append(x)
            return Node("tensor", torch.Tensor, len(self.tensors) - 1)
        t = type(x)
        if x is None or t in (bool, int, float, str, complex, bytes, torch.dtype, torch.device):
            return Node("const", t, x)
        mark = (len(self.tensors), len(self.containers))
        done, index = self.container(x)
        if done is not None:
            return done
        if t in (tuple, list) or (isinstance(x, tuple) and hasattr(x, "_fields")):
            node = Node("seq", t, None, tuple(self.walk(v, depth + 1) for v in x), index)
        elif t in (dict, OrderedDict):
            keys = tuple(x.keys())
            node = Node("map", t, keys, tuple(self.walk(x[k], depth + 1) for k in keys), index)
        elif t in torch_pytree.SUPPORTED_NODES:
            children, context = torch_pytree.SUPPORTED_NODES[t].flatten_fn(x)
            node = Node("registered", t, context, tuple(self.walk(v, depth + 1) for v in children), index)
        elif _walkable(x):
            attrs = tuple(vars(x).keys())
            node = Node("object", t, attrs, tuple(self.walk(v, depth + 1) for v in vars(x).values()), index)
        else:
            node = None
        if node is None or not _has_tensor(node):
            # No tensor below: the container is a constant (walked only to find that out).
            for c in self.containers[mark[1] :]:
                del self.seen[id(c)]
            self.tensors[mark[0] :], self.containers[mark[1] :] = [], []
            return Node("const", t, x)
        return node


def _has_tensor(node: Node) -> bool:
    return node.kind in ("tensor", "input", "ref") or any(_has_tensor(c) for c in node.children)


def holds_objects(node: Node) -> bool:
    """Whether a structure has containers other than tuples, lists and dicts (objects a model may
    change other than through their tensors)."""
    return node.kind in ("object", "registered") or any(holds_objects(c) for c in node.children)


@dataclass(frozen=True)
class Flat:
    """A tree flattened: its tensors, the containers walked and its structure."""

    tensors: list[torch.Tensor]
    containers: list[Any]  # the containers walked, in preorder (`Node.index`)
    node: Node


def flatten(tree: Any, inputs: dict[int, int] | None = None) -> Flat:
    """`tree` as tensors, containers and a structure (see the module docstring). `inputs` maps the id
    of each container of the caller's arguments (as rebuilt for tracing) to its index; a result that
    holds one of them is recorded as `Input` instead of walked."""
    f = _Flattener(inputs)
    node = f.walk(tree, 0)
    return Flat(f.tensors, f.containers, node)


def rebuild(node: Node, tensors: Sequence[Any], inputs: Sequence[Any] = (),
            made: dict[int, Any] | None = None) -> Any:  # fmt: skip
    """The structure `node` around `tensors` (leaf i is `tensors[i]`). `inputs` are the containers of
    the call (for "input" nodes); `made`, when given, collects every container made, by preorder index."""
    made = {} if made is None else made
    return _Build(tensors, inputs, made).build(node)


def plain_result(rebuild_fn: Any, n: int) -> type | None:
    """For a capture's `rebuild` (`functools.partial(rebuild, node)`) of a result that is its `n`
    tensor leaves themselves, in order: `torch.Tensor` (one leaf, returned bare) or the tuple or list
    type holding them, so a call makes the result without walking the tree; None otherwise."""
    if not (isinstance(rebuild_fn, functools.partial) and rebuild_fn.func is rebuild
            and len(rebuild_fn.args) == 1 and not rebuild_fn.keywords):  # fmt: skip
        return None
    node = rebuild_fn.args[0]
    if not isinstance(node, Node):
        return None
    if node.kind == "tensor":
        return torch.Tensor if n == 1 and node.meta == 0 else None
    plain = (node.kind == "seq" and node.type in (tuple, list) and len(node.children) == n
             and all(c.kind == "tensor" and c.meta == i for i, c in enumerate(node.children)))  # fmt: skip
    return node.type if plain else None


class _Build:
    def __init__(self, tensors: Sequence[Any], inputs: Sequence[Any], made: dict[int, Any]) -> None:
        self.tensors, self.inputs, self.made = tensors, inputs, made

    def build(self, n: Node) -> Any:
        k = n.kind
        if k == "tensor":
            return self.tensors[n.meta]
        if k == "const":
            return n.meta
        if k == "input":
            return self.inputs[n.meta]
        if k == "ref":
            if n.meta not in self.made:
                raise FrontendError(f"a {n.type.__name__} contains itself; cannot rebuild it")
            return self.made[n.meta]
        if k == "object":
            cls: Any = n.type
            obj = cls.__new__(cls)  # no __init__: the attributes are set below
            self.made[n.index] = obj  # before the children: an attribute may refer back to it
            obj.__dict__.update(zip(n.meta, (self.build(c) for c in n.children), strict=True))
            return obj
        children = [self.build(c) for c in n.children]
        if k == "seq":
            out: Any = n.type(children) if n.type in (tuple, list) else n.type(*children)
        elif k == "map":
            out = n.type(zip(n.meta, children, strict=True))
        else:
            out = torch_pytree.SUPPORTED_NODES[n.type].unflatten_fn(children, n.meta)
        self.made[n.index] = out
        return out


def state_of(containers: dict[int, Any]) -> dict[int, tuple[Any, ...]]:
    """What a model could change in place on the containers made for tracing: each object's attributes
    and each list's and dict's entries, as (name or position, value) pairs compared by identity."""
    out: dict[int, tuple[Any, ...]] = {}
    for i, c in containers.items():
        if isinstance(c, list):
            out[i] = tuple(enumerate(c))
        elif type(c) in (dict, OrderedDict):
            out[i] = tuple(c.items())
        elif _walkable(c):
            out[i] = tuple(vars(c).items())
    return out


def changed_state(before: dict[int, tuple[Any, ...]], containers: dict[int, Any]) -> str | None:
    """A description of the first container whose state differs from `before` (by identity), or None.
    The compiled graph replays only tensor updates, so any other change would be lost."""
    after = state_of(containers)
    for i, old in before.items():
        new = after[i]
        if len(old) != len(new) or any(_differs(a, b) for a, b in zip(old, new, strict=True)):
            what = type(containers[i]).__name__
            names = [_name(a) for a, b in zip(old, new, strict=False) if _differs(a, b)]
            where = f" ({', '.join(names)})" if names else ""
            return f"the model changes a {what} it was given{where}"
    return None


def _differs(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    return a[0] != b[0] or a[1] is not b[1]


def _name(a: tuple[Any, Any]) -> str:
    return str(a[0])


CallTree = tuple[tuple[Any, ...], dict[str, Any]]


def call_tree(args: Sequence[Any], kwargs: dict[str, Any]) -> CallTree:
    """The one tree a call is flattened as: the positional arguments and the keyword ones."""
    return (tuple(args), dict(kwargs))


def call_of(tree: Any) -> CallTree:
    """`(args, kwargs)` back from a rebuilt call tree."""
    args, kwargs = tree
    return tuple(args), dict(kwargs)


Rebuild = Callable[[Sequence[Any], Sequence[Any]], Any]
