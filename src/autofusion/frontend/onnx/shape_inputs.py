"""Graph inputs whose values the conversion needs: shapes, axes, pads, sizes given at call time.

Our IR has static shapes, so a Reshape shape, a Slice's starts, a Reduce's axes... must be known when
the graph is converted. An initializer is; a graph input is not, until the call. Such an input is read
on the host at call time and its value becomes part of the compiled model's signature
(`OnnxSource.signature`): the graph is converted with the value bound as a known constant, and a call
with another value converts (or finds in the signature cache) another graph, so a value never runs a
graph built for a different one. The input stays in the compiled graph's input list (the call takes
the same arguments) but nothing reads it: no kernel is passed it.

Which inputs: `value_inputs` walks back from every shape-like input position of the ops in
`SHAPE_INPUTS` (the ONNX spec's) through the nodes that compute it (shape arithmetic, which the
converter evaluates at import once its inputs are known) to graph inputs; an input is taken when
every graph input the walk reaches is an integer tensor (floats too for the float positions, such as
Resize's scales). A value that depends on real data (a NonZero of an activation, a Shape-free
computation from a float input) is not: it stays computed at run time, which the converter reports.
Converters asking `ctx.ints` for a position not in the table are covered too: the walk then raises
`NeedsInputValues` naming the inputs, and the source adds them to its signature and converts again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx

from autofusion.frontend.onnx.loader import DEFAULT_DOMAINS, graph_inputs

# At most this many elements are read and keyed on: shape-like inputs are rank-sized.
MAX_VALUE_ELEMENTS = 64

# Per op: the input positions that are shapes, axes, counts or sizes (integer tensors), from the spec.
_REDUCE = ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceSumSquare",
           "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")  # fmt: skip
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Pad": (1, 3),
    "ConstantOfShape": (0,),
    "TopK": (1,),
    "Resize": (3,),
    "OneHot": (1,),
    "Range": (0, 1, 2),
    "CenterCropPad": (1,),
    "Col2Im": (1, 2),
    "Trilu": (1,),
    "CumSum": (1,),
    "CumProd": (1,),
    "DFT": (1, 2),
    "STFT": (1, 3),
    "MaxUnpool": (2,),
    "AffineGrid": (1,),
    "BlackmanWindow": (0,),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    **{op: (1,) for op in _REDUCE},
}
# Positions whose value is a float the conversion needs (Resize's roi and scales), or a scalar fill
# value (Pad's constant_value) that the IR op takes as a literal.
FLOAT_INPUTS: dict[str, tuple[int, ...]] = {"Resize": (1, 2), "Upsample": (1,), "Pad": (2,)}

# Ops whose outputs are known without their inputs' values (only their shapes, which are static).
_SHAPE_ONLY = {"Shape", "Size"}
# Ops whose outputs are not a function of their inputs' values.
_UNFOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
               "Bernoulli", "If", "Loop", "Scan"}  # fmt: skip


class NeedsInputValues(Exception):  # a signal to the source, not an error the user sees
    """The conversion needs the values of these graph inputs (a converter asked `ctx.ints` for a value
    that only they determine): the source binds them and converts again."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(sorted(set(names)))
        super().__init__(f"the values of input(s) {', '.join(self.names)} are needed at import")


def is_integer(elem_type: int) -> bool:
    return elem_type in {
        onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8, onnx.TensorProto.BOOL,
    }  # fmt: skip


def is_float(elem_type: int) -> bool:
    return elem_type in {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}


class Origins:
    """For any value of a graph: the graph inputs its value is computed from, through nodes whose
    outputs the conversion computes at import once their inputs are known."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.producer: dict[str, onnx.NodeProto] = {}
        for node in model.graph.node:
            for o in node.output:
                if o:
                    self.producer[o] = node
        self.inits = {t.name for t in model.graph.initializer}
        self.inputs = {vi.name: vi for vi in graph_inputs(model)}

    def of(self, name: str, floats: bool, known: Callable[[str], bool] | None = None) -> set[str] | None:
        """The graph inputs `name` is computed from (initializers, and values for which `known` says
        True, stop the walk), or None when its value depends on something the walk cannot bind: a
        float input where only integers are taken (`floats` False), a random or control-flow op."""
        seen: set[str] = set()
        found: set[str] = set()
        stack = [name]
        while stack:
            v = stack.pop()
            if not v or v in seen or v in self.inits or (known is not None and known(v)):
                continue
            seen.add(v)
            vi = self.inputs.get(v)
            if vi is not None:
                t = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
                if not (is_integer(t) or (floats and is_float(t))):
                    return None
                found.add(v)
                continue
            node = self.producer.get(v)
            if node is None or node.domain not in DEFAULT_DOMAINS or node.op_type in _UNFOLDABLE:
                return None
            if node.op_type in _SHAPE_ONLY or node.op_type == "Constant":
                continue
            stack.extend(node.input)
        return found


def value_inputs(model: onnx.ModelProto) -> set[str]:
    """The graph inputs whose values reach a shape-like position of a node (see the module docstring)."""
    origins = Origins(model)
    if not origins.inputs:
        return set()
    taken: set[str] = set()
    for node in model.graph.node:
        if node.domain not in DEFAULT_DOMAINS:
            continue
        for floats, table in ((False, SHAPE_INPUTS), (True, FLOAT_INPUTS)):
            for i in table.get(node.op_type, ()):
                if i < len(node.input) and node.input[i]:
                    found = origins.of(node.input[i], floats)
                    if found:
                        taken |= found
    return taken
