"""What converters see: tensor references, the conversion context and the converter registry.

A converter turns one ATen call into IR nodes. It receives the call's arguments normalised to the
op schema's parameter names (`a["self"]`, `a["dim"]`...), with every tensor argument replaced by a
`TV` (value id and IR type), and returns a `TV` or a tuple of them (None for outputs it cannot give).
A converter that cannot handle a particular call raises `UnsupportedOpError` with a reason; the driver
then rolls back whatever it added and runs the call as an extern ATen op.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autofusion.errors import UnsupportedOpError
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import GraphBuilder
from autofusion.ir.types import TensorType


@dataclass(frozen=True, slots=True)
class TV:
    """A tensor value inside the graph being built."""

    id: int
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank


ConvResult = TV | tuple[TV | None, ...]
Converter = Callable[["ConvCtx", dict[str, Any]], ConvResult]
CONVERTERS: dict[str, Converter] = {}


def registrar(table: dict[str, Any], what: str) -> Callable[..., Callable[[Any], Any]]:
    """A decorator factory that files a converter under each of its names in `table` (one per name:
    a second registration is a programming error). Both frontends (ATen, ONNX) use it."""

    def register(*names: str) -> Callable[[Any], Any]:
        def deco(fn: Any) -> Any:
            for n in names:
                if n in table:
                    raise ValueError(f"{what}{n} registered twice")
                table[n] = fn
            return fn

        return deco

    return register


# Register a converter for ATen op packets by name ("add" means every overload of aten.add).
converts = registrar(CONVERTERS, "converter for aten.")


def unsupported(reason: str) -> UnsupportedOpError:
    return UnsupportedOpError(reason)


class NodeBuilder:
    """What both frontends' converter contexts share: IR nodes added under the source node's name and
    location. Subclasses set `b` (the GraphBuilder), `name` and `loc`."""

    b: GraphBuilder
    name: str
    loc: str | None

    def add(self, op: str, inputs: Iterable[TV], attrs: Mapping[str, Any] | None = None) -> TV:
        vid = self.b.add(op, [t.id for t in inputs], attrs, name=self.name, loc=self.loc)
        return TV(vid, self.b.type_of(vid))

    def scalar(self, value: Any, dtype: DType) -> TV:
        return self.add("full", (), {"value": py_value(value, dtype), "dtype": dtype})

    def cast(self, t: TV, dtype: DType) -> TV:
        return t if t.dtype is dtype else self.add("cast", (t,), {"dtype": dtype})


class ConvCtx(NodeBuilder):
    """Builds IR for one ATen call; knows the call's overload and the types torch says it produces."""

    def __init__(self, builder: GraphBuilder, packet: str, overload: str,
                 expected: tuple[TensorType | None, ...], name: str, loc: str | None) -> None:  # fmt: skip
        self.b = builder
        self.overload_packet = packet  # "add" for aten.add.Tensor
        self.overload = overload  # "Tensor" for aten.add.Tensor
        self.expected = expected
        self.name = name
        self.loc = loc

    @property
    def out_type(self) -> TensorType:
        t = self.expected[0] if self.expected else None
        if t is None:
            raise unsupported("torch reports no tensor output for this call")
        return t

    @property
    def out_dtype(self) -> DType:
        return self.out_type.dtype

    def value(self, x: TV | int | float | bool, dtype: DType) -> TV:
        """A tensor of `dtype` from a tensor (cast if needed) or a Python scalar (a 0-d literal)."""
        return self.cast(x, dtype) if isinstance(x, TV) else self.scalar(x, dtype)

    def reshape(self, t: TV, shape: Sequence[int]) -> TV:
        shape = tuple(shape)
        return t if t.shape == shape else self.add("reshape", (t,), {"shape": shape})


def py_value(value: Any, dtype: DType) -> int | float | bool:
    """`value` as a literal of `dtype`: converted as torch converts a Python scalar to that type (half types
    round to nearest even, so a literal holds a value of its type and every consumer reads the same one)."""
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return int(value)
    if dtype in (DType.float16, DType.bfloat16):
        return float(torch.tensor(float(value), dtype=torch.float64).to(dtype.to_torch()))
    return float(value)


def result_type(*args: TV | int | float | bool) -> DType:
    """torch's type promotion over tensors and Python scalars (0-d tensors rank below n-d ones)."""
    probes: list[Any] = []
    for a in args:
        if isinstance(a, TV):
            probes.append(torch.empty((1,) if a.rank else (), dtype=a.dtype.to_torch()))
        else:
            probes.append(a)
    if len(probes) == 1:
        p = probes[0]
        return (
            DType.from_torch(p.dtype)
            if isinstance(p, torch.Tensor)
            else DType.from_torch(torch.tensor(p).dtype)
        )
    dt = torch.result_type(probes[0], probes[1])
    for p in probes[2:]:
        dt = torch.promote_types(dt, p.dtype if isinstance(p, torch.Tensor) else torch.tensor(p).dtype)
    return DType.from_torch(dt)


def norm_dims(dims: Any, rank: int) -> tuple[int, ...]:
    """Normalise a dim / dim list argument (None or [] = all dims) to sorted non-negative dims.
    A 0-d tensor accepts dim 0 or -1 (torch treats it as one element) and has no dim to reduce."""
    if dims is None or rank == 0:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    r = max(rank, 1)
    return tuple(sorted({d % r for d in dims})) if dims else tuple(range(rank))
