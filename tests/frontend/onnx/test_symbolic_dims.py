"""ONNX models with symbolic input dims: converted once, instantiated for each new size
(`frontend/onnx/symbolic.py`), results equal to onnxruntime's at many sizes; guards and sizes 0/1
convert for themselves."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import autofusion
from autofusion.frontend.onnx.symbolic import make_template
from autofusion.ir.symbolic import Guards, SymInt, evaluate

N = helper.make_node
f32 = np.float32


def _reshape_softmax_model() -> onnx.ModelProto:
    """x[batch, seq, 8] -> Reshape to [batch, seq*8] (computed from Shape, as exporters write it) ->
    Softmax -> Reshape back to x's shape -> * Relu(x)."""
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)  # noqa: E731
    nodes = [
        N("Shape", ["x"], ["shp"]),
        N("Gather", ["shp", "i0"], ["b"], axis=0),
        N("Gather", ["shp", "i1"], ["s"], axis=0),
        N("Mul", ["s", "eight"], ["s8"]),
        N("Concat", ["b", "s8"], ["flat"], axis=0),
        N("Reshape", ["x", "flat"], ["r"]),
        N("Softmax", ["r"], ["sm"], axis=-1),
        N("Reshape", ["sm", "shp"], ["back"]),
        N("Relu", ["x"], ["rx"]),
        N("Mul", ["back", "rx"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "sym", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        initializer=[i64("i0", [0]), i64("i1", [1]), i64("eight", [8])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_symint_arithmetic_and_guards() -> None:
    b = SymInt.symbol("batch", 3)
    guards = Guards()
    with guards.recording():
        n = b * 16 + 2
        assert b != 1
    assert n == 50 and isinstance(n, SymInt) and n.describe() == "((batch*16)+2)"
    assert evaluate((n, 4), {"batch": 5}) == (82, 4)
    assert guards.hold({"batch": 7}) and not guards.hold({"batch": 1})


def test_converted_once_for_many_sizes(ort_run, monkeypatch) -> None:
    import autofusion.frontend.onnx.convert as convert_module
    import autofusion.frontend.onnx.symbolic as symbolic_module

    walks: list[str] = []  # every ONNX -> IR conversion, counted where it happens
    for module in (convert_module, symbolic_module):
        real = module.drive

        def counting(walk, real=real):  # type: ignore[no-untyped-def]
            walks.append(type(walk).__name__)
            return real(walk)

        monkeypatch.setattr(module, "drive", counting)
    model = _reshape_softmax_model()
    cm = autofusion.compile(model)
    # odd sizes, 1 (converted for itself), and one above the kernels' parallel threshold
    sizes = [(2, 3), (3, 5), (5, 7), (1, 4), (2, 1), (64, 129), (3, 5)]
    rng = np.random.default_rng(0)
    for b, s in sizes:
        x = rng.standard_normal((b, s, 8)).astype(f32)
        np.testing.assert_allclose(cm(x).numpy(), ort_run(model, [x])[0], rtol=1e-5, atol=1e-6)
        assert cm.stats["generated_calls"] > 0
    sym = cm.stats["onnx_symbolic"]
    assert sym["on"] and sym["trusted"] and sym["symbols"] == {"batch": 2, "seq": 3}
    # The template once, one check conversion at the first new sizes, and the two calls with a size 1.
    assert sym["conversions"] == 4
    assert sym["instantiations"] == 4  # (2,3), (3,5), (5,7), (64,129); the repeated (3,5) hit the cache
    assert sum(sym["converted_for_themselves"].values()) == 2
    assert cm.stats["signatures_planned"] == 6
    assert walks == ["_SymbolicWalk", "_Walk", "_Walk", "_Walk"]  # the template, the check, two size-1 calls


def test_instantiation_is_the_conversion_of_those_sizes() -> None:
    from autofusion.frontend.onnx.convert import convert_model
    from autofusion.frontend.onnx.loader import fix_input_shapes
    from autofusion.frontend.onnx.symbolic import difference

    model = _reshape_softmax_model()
    t = make_template(model, "m", {"x": (4, 6, 8)})
    for b, s in ((2, 3), (9, 17)):
        got = t.instantiate(t.bind({"x": (b, s, 8)})).graph
        real = convert_model(fix_input_shapes(model, {"x": (b, s, 8)}, "m"), "m").graph
        assert difference(got, real, got.constants, real.constants) is None
        assert all(not isinstance(d, SymInt) for n in got.nodes for v in n.outputs for d in v.type.shape)


def test_a_failing_guard_converts_again(ort_run) -> None:
    # Slice x[:, 0:4]: the end is clamped to the dim, a comparison recorded as a guard (n > 4 at the hint).
    graph = helper.make_graph(
        [N("Slice", ["x", "st", "en", "ax"], ["sl"]), N("Neg", ["sl"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", None])],
        initializer=[helper.make_tensor(k, TensorProto.INT64, [1], [v]) for k, v in
                     (("st", 0), ("en", 4), ("ax", 1))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(1)
    cm = autofusion.compile(model, [rng.standard_normal((3, 6)).astype(f32)])
    for b, n in ((3, 6), (5, 9), (2, 3), (4, 2)):
        x = rng.standard_normal((b, n)).astype(f32)
        np.testing.assert_allclose(cm(x).numpy(), ort_run(model, [x])[0])
    sym = cm.stats["onnx_symbolic"]
    reasons = sym["converted_for_themselves"]
    assert any("guard" in r for r in reasons), reasons  # n = 3 and n = 2 fall below the slice's end
    assert sym["instantiations"] >= 2


def test_a_model_without_symbolic_dims_has_no_template(onnx_model) -> None:
    model = onnx_model([N("Relu", ["x"], ["y"])], [("x", f32, [2, 3])], [("y", f32, [2, 3])])
    cm = autofusion.compile(model)
    torch.testing.assert_close(cm(torch.ones(2, 3)), torch.ones(2, 3))
    assert "onnx_symbolic" not in cm.stats


@pytest.mark.parametrize("batch", [2, 5])
def test_exported_transformer_batch_and_seq(ort_run, batch: int) -> None:
    import io
    import warnings

    class Attn(torch.nn.Module):
        def __init__(self, d: int = 16, h: int = 2) -> None:
            super().__init__()
            self.h, self.qkv, self.o = h, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
            return x + self.o(a.transpose(1, 2).reshape(b, t, d))

    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Attn().eval(), (torch.randn(2, 5, 16),), buf, dynamo=False, opset_version=17,
                          input_names=["x"], dynamic_axes={"x": {0: "batch", 1: "seq"}})  # fmt: skip
    model = onnx.load_from_string(buf.getvalue())
    cm = autofusion.compile(model, [torch.randn(3, 7, 16)], fusion=False)
    for seq in (4, 11):
        x = torch.randn(batch, seq, 16)
        np.testing.assert_allclose(cm(x).numpy(), ort_run(model, [x.numpy()])[0], rtol=1e-4, atol=1e-5)
    sym = cm.stats["onnx_symbolic"]
    assert sym["on"] and sym["trusted"] and sym["conversions"] == 2 and sym["instantiations"] == 3


def _export(model: torch.nn.Module, example: torch.Tensor, axes: dict[int, str]) -> onnx.ModelProto:
    import io
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (example,), buf, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": axes})  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


class _CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.c2(torch.relu(self.c1(x)))), 2)
        return self.fc(y.mean((2, 3)))


class _Decoder(torch.nn.Module):
    """Token and position embeddings (Range of the sequence length), a causal mask (Trilu)."""

    def __init__(self, vocab: int = 50, d: int = 16) -> None:
        super().__init__()
        self.e, self.p = torch.nn.Embedding(vocab, d), torch.nn.Embedding(64, d)
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.e(ids) + self.p(torch.arange(t).unsqueeze(0))
        q, k, v = self.qkv(x).split(16, -1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        return self.o(((q @ k.transpose(-1, -2)) / 4.0).masked_fill(mask, float("-inf")).softmax(-1) @ v)


def test_conv_net_with_symbolic_batch_height_width(ort_run) -> None:
    # Strided conv and pool sizes are floor divisions of the symbols; the pool runs as an extern,
    # typed again from its implementation at each size.
    torch.manual_seed(0)
    model = _export(_CNN(), torch.randn(2, 3, 16, 16), {0: "batch", 2: "h", 3: "w"})
    cm = autofusion.compile(model, fusion=False)
    rng = np.random.default_rng(2)
    for shape in ((2, 3, 17, 21), (3, 3, 12, 12), (2, 3, 31, 9), (4, 3, 16, 16)):
        x = rng.standard_normal(shape).astype(f32)
        np.testing.assert_allclose(cm(x).numpy(), ort_run(model, [x])[0], rtol=1e-5, atol=1e-6)
    sym = cm.stats["onnx_symbolic"]
    assert sym["on"] and sym["trusted"] and sym["conversions"] == 2 and sym["instantiations"] == 4


def test_decoder_with_range_and_causal_mask(ort_run) -> None:
    torch.manual_seed(0)
    model = _export(_Decoder(), torch.randint(0, 50, (2, 5)), {0: "batch", 1: "seq"})
    cm = autofusion.compile(model, fusion=False)
    rng = np.random.default_rng(3)
    for shape in ((2, 5), (3, 9), (4, 17), (2, 2)):
        x = rng.integers(0, 50, shape).astype(np.int64)
        np.testing.assert_allclose(cm(x).numpy(), ort_run(model, [x])[0], rtol=1e-5, atol=1e-6)
    sym = cm.stats["onnx_symbolic"]
    assert sym["on"] and sym["trusted"] and sym["conversions"] == 2 and sym["instantiations"] == 4
    assert "arange" in cm.stats["op_counts"]  # the positions follow the sequence length at run time
