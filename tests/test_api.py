"""autofusion.compile and the torch.compile backend: results, caching, input errors, eager fallbacks."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch

import autofusion
import autofusion.api
import autofusion.errors
from autofusion.errors import ExecutionError, InputMismatchError


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.fc(x)
        return {"h": h.relu(), "pair": (h.sum(-1), x * 2)}


def test_compile_matches_eager_and_keeps_output_structure() -> None:
    m = Small().eval()
    x = torch.randn(3, 8)
    cm = autofusion.compile(m, (x,))
    out, ref = cm(x), m(x)
    assert set(out) == {"h", "pair"} and isinstance(out["pair"], tuple)
    torch.testing.assert_close(out, ref)
    assert cm.stats["ops"] == len(cm.graph.nodes) > 0
    assert cm.stats["extern_calls"] == 0
    assert "linear" in cm.stats["op_counts"]


def test_parameters_are_read_live(monkeypatch: pytest.MonkeyPatch) -> None:
    m = Small().eval()
    x = torch.randn(3, 8)
    cm = autofusion.compile(m, (x,))
    with torch.no_grad():
        m.fc.bias.add_(1.0)
    torch.testing.assert_close(cm(x), m(x))


def test_replaced_parameters_are_read_live() -> None:
    """A new nn.Parameter assigned to a layer and load_state_dict(assign=True) replace the tensor
    objects; the compiled model must read the new ones (it used to keep the ones bound at capture)."""
    m = Small().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        cm = autofusion.compile(m, (x,))
        cm(x)
        m.fc.weight = torch.nn.Parameter(torch.randn(4, 8))
        torch.testing.assert_close(cm(x), m(x))
        m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()}, assign=True)
        torch.testing.assert_close(cm(x), m(x))
        m.fc.bias = None  # no longer a tensor: a clear error, not the old bias
        with pytest.raises(autofusion.errors.FrontendError, match=r"fc\.bias is now a NoneType"):
            cm(x)
    assert cm.stats["generated_calls"] >= 3


def test_a_removed_submodule_is_a_clear_error() -> None:
    """A layer set to None after compiling: its parameters are gone, which is said (it used to surface
    as a bare AttributeError from the parameter lookup)."""
    m = Small().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        cm = autofusion.compile(m, (x,))
        cm(x)
        m.fc = None
        with pytest.raises(autofusion.errors.FrontendError, match=r"no longer has fc\.(weight|bias)"):
            cm(x)


def test_one_capture_per_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = autofusion.api.capture

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(autofusion.api, "capture", counting)
    cm = autofusion.compile(lambda a, b: (a + b).sin())
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    for _ in range(3):
        torch.testing.assert_close(cm(a, b), (a + b).sin())
    assert len(calls) == 1
    c = torch.randn(2, 5)
    torch.testing.assert_close(cm(c, c), (c + c).sin())  # new shape
    # new dtype; fused kernels compute halves in fp32 without rounding a+b first, so allow fp16 ulps
    torch.testing.assert_close(cm(a.half(), b.half()), (a.half() + b.half()).sin(), rtol=1e-2, atol=2e-3)
    at = torch.randn(5, 4).t()
    torch.testing.assert_close(cm(at, b), (at + b).sin())  # new strides
    assert len(calls) == 4 and cm.stats["signatures"] == 4
    assert cm.graph.inputs[0].value.type.dtype.short == "f32"  # .graph follows the last call


def test_bad_inputs_raise_clear_errors() -> None:
    cm = autofusion.compile(lambda a, b: a * b, (torch.ones(2), torch.ones(2)))
    with pytest.raises(TypeError, match="expected 2 input tensor"):
        cm(torch.ones(2))
    # A non-tensor argument is a constant of the call (compiled per value); this model cannot take one.
    with pytest.raises(TypeError):  # the model's own error, from the eager run
        cm(torch.ones(2), "x")
    torch.testing.assert_close(cm(torch.ones(2), b=torch.full((2,), 3.0)), torch.full((2,), 3.0))
    with pytest.raises(TypeError, match=r"unknown option\(s\) 'captur' \(did you mean 'capture'\?\)"):
        autofusion.compile(lambda a: a, captur="strict")
    with pytest.raises(ValueError, match="capture='dynamo'"):
        autofusion.compile(lambda a: a, capture="dynamo")
    with pytest.raises(TypeError, match="option fusion_config must be a string, got dict"):
        autofusion.compile(lambda a: a, fusion_config={"conv_bn": "on"})
    with pytest.raises(TypeError, match="option max_fusion_size must be an integer"):
        autofusion.compile(lambda a: a, max_fusion_size="8")
    with pytest.raises(TypeError, match=r"nn\.Module or a function"):
        autofusion.compile(42)
    assert issubclass(InputMismatchError, TypeError)


def test_numpy_inputs_are_accepted() -> None:
    cm = autofusion.compile(lambda a: a.exp())
    arr = np.linspace(0, 1, 6, dtype=np.float32)
    torch.testing.assert_close(cm(arr), torch.from_numpy(arr).exp())


def test_autograd_runs_eagerly_with_a_message(caplog: pytest.LogCaptureFixture) -> None:
    m = Small()
    x = torch.randn(3, 8, requires_grad=True)
    cm = autofusion.compile(m)
    with caplog.at_level(logging.WARNING):
        out = cm(x)
        cm(x)
    assert out["h"].grad_fn is not None
    assert caplog.text.count("compiles inference graphs") == 1  # once, not per call
    assert "requires grad" in cm.stats["eager_fallback"]
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x))
    assert cm.stats["ops"] > 0 and "eager_fallback" not in cm.stats  # this call ran compiled
    with caplog.at_level(logging.WARNING):
        cm(x)  # grad again, after a compiled call took the hot path
    assert "requires grad" in cm.stats["eager_fallback"]


def test_uncapturable_model_runs_eagerly_with_reason(caplog: pytest.LogCaptureFixture) -> None:
    def data_dependent(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # control flow on data: export cannot capture this
            return x * 2
        return x * 3

    cm = autofusion.compile(data_dependent)
    x = torch.ones(4)
    with caplog.at_level(logging.WARNING):
        torch.testing.assert_close(cm(x), x * 2)
        torch.testing.assert_close(cm(-x), -x * 3)
    assert "running data_dependent eagerly" in caplog.text
    assert "could not capture" in cm.stats["eager_fallback"]
    with pytest.raises(RuntimeError, match="runs eagerly"):
        _ = cm.graph


def test_mutating_model_compiles_and_updates_its_input() -> None:
    def mutate(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    cm = autofusion.compile(mutate)
    x = torch.zeros(3)
    torch.testing.assert_close(cm(x), torch.full((3,), 2.0))
    assert x.tolist() == [1.0, 1.0, 1.0]
    torch.testing.assert_close(cm(x), torch.full((3,), 4.0))
    assert x.tolist() == [2.0, 2.0, 2.0]
    assert "eager_fallback" not in cm.stats and cm.stats["generated_calls"] == 2


class Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.emb(idx) * 2  # the embedding line: errors must point here


def test_execution_error_names_node_and_source_line() -> None:
    m = Lookup().eval()
    cm = autofusion.compile(m, (torch.tensor([1, 2]),))
    with pytest.raises(ExecutionError) as info:
        cm(torch.tensor([1, 99]))
    msg = str(info.value)
    assert "index_select" in msg and "test_api.py" in msg and "in forward" in msg
    assert isinstance(info.value, RuntimeError)


def _recording_graphs(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every CompiledGraph the torch.compile backend builds (however Dynamo found the backend)."""
    import autofusion.backend

    made: list = []

    class Recording(autofusion.api.CompiledGraph):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(autofusion.backend, "CompiledGraph", Recording)
    return made


def test_torch_compile_backend_by_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    m = Small().eval()
    x = torch.randn(3, 8)
    made = _recording_graphs(monkeypatch)
    torch._dynamo.reset()
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        out = torch.compile(m, backend="autofusion")(x)
    torch.testing.assert_close(out, m(x))
    assert "eagerly" not in caplog.text
    assert len(made) == 1, "the backend found by name did not compile the graph"
    stats = made[0].stats()
    assert "build_error" not in stats and stats["kernel_steps"] >= 1
    assert stats["generated_calls"] >= 1, "the backend's graph ran no generated code"


def test_generated_calls_count_every_run() -> None:
    x = torch.randn(64, 64)
    for mode in ("off", "on"):
        cm = autofusion.compile(lambda a: (a.exp() + 1).sum(-1), [x], super_kernel=mode)
        assert cm.stats["generated_calls"] == 0  # compiled, not yet run
        for _ in range(3):
            cm(x)
        per_run = cm.stats["super_kernel"].get("calls_per_run", cm.stats["kernel_steps"])
        assert cm.stats["kernel_steps"] >= 1 and cm.stats["generated_calls"] == 3 * per_run
    ref = autofusion.compile(lambda a: (a.exp() + 1).sum(-1), [x], fusion=False)
    ref(x)
    assert ref.stats["generated_calls"] == 0  # the reference runtime runs no generated code


def test_failed_build_shows_in_stats_and_runs_no_generated_code() -> None:
    x = torch.randn(8, 8)
    cm = autofusion.compile(lambda a: (a * 2).tanh(), [x], cxx="/nonexistent/g++")
    torch.testing.assert_close(cm(x), (x * 2).tanh())
    assert cm.stats["build_error"] and cm.stats["kernel_steps"] == 1 and cm.stats["generated_calls"] == 0


def _recording_backend(seen: list):
    def backend(gm, example_inputs):
        fn = autofusion.autofusion_backend(gm, example_inputs)
        seen.append(fn)
        return fn

    return backend


def test_torch_compile_backend_with_grad_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    m = Small()
    x = torch.randn(3, 8)
    torch._dynamo.reset()
    seen: list = []
    with caplog.at_level(logging.WARNING):
        out = torch.compile(m, backend=_recording_backend(seen))(x)
    assert out["h"].grad_fn is not None
    assert caplog.text.count("needs autograd") == 1
    assert len(seen) == 1 and seen[0].autofusion_graph is None
    assert "needs autograd" in seen[0].autofusion_stats()["eager_fallback"]


def test_torch_compile_backend_capture_failure_runs_eagerly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import autofusion.backend
    from autofusion.errors import FrontendError

    def refuse(*args, **kwargs):
        raise FrontendError("could not capture the model: refused by the test")

    monkeypatch.setattr(autofusion.backend, "capture", refuse)
    torch._dynamo.reset()
    seen: list = []
    x = torch.randn(5, 3)
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        torch.testing.assert_close(torch.compile(lambda a: a.sin() * 2, backend=_recording_backend(seen))(x),
                                   x.sin() * 2)  # fmt: skip
    assert "refused by the test" in caplog.text
    assert seen and "refused by the test" in seen[0].autofusion_stats()["eager_fallback"]


def test_dynamic_shapes_run_compiled(caplog: pytest.LogCaptureFixture) -> None:
    # A graph with symbolic sizes is specialised per call signature (tests/test_dynamic.py has more).
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(lambda x: (x * 2).sin(), backend=_recording_backend(seen), dynamic=True)
    x = torch.randn(5, 3)
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        torch.testing.assert_close(fn(x), (x * 2).sin())
    assert "eagerly" not in caplog.text
    stats = seen[0].autofusion_stats()
    assert seen[0].autofusion_graph is not None and "eager_fallback" not in stats
    assert stats["generated_calls"] >= 1


def test_a_sparse_input_runs_eagerly_with_a_reason(caplog):
    # A sparse CSR tensor has no strides: computing the signature used to raise RuntimeError.
    f = lambda a: a.to_dense() * 2  # noqa: E731
    x = torch.eye(3).to_sparse_csr()
    cm = autofusion.compile(f, [x])
    with caplog.at_level("WARNING", logger="autofusion"):
        out = cm(x)
    assert torch.equal(out, f(x))
    assert "layout torch.sparse_csr" in cm.stats["eager_fallback"]
    assert any("sparse_csr" in r.getMessage() for r in caplog.records)


def test_parameters_requiring_grad_under_grad_mode_warn_once(caplog):
    # The compiled graph has no autograd: results would come back without grad_fn, silently.
    m = torch.nn.Linear(8, 8).eval()
    x = torch.randn(4, 8)
    cm = autofusion.compile(m, [x])
    with caplog.at_level("WARNING", logger="autofusion"):
        out = cm(x)
        cm(x)
    torch.testing.assert_close(out, m(x).detach())
    hits = [r for r in caplog.records if "autograd history" in r.getMessage()]
    assert len(hits) == 1
    caplog.clear()
    with torch.no_grad(), caplog.at_level("WARNING", logger="autofusion"):
        cm2 = autofusion.compile(m, [x])
        cm2(x)
    assert not [r for r in caplog.records if "autograd history" in r.getMessage()]


def _onnx_softmax(batch: int | str) -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "soft", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_torch_and_onnx_sources_give_one_class_with_the_same_accessors() -> None:
    x = torch.randn(3, 8)
    torch_cm = autofusion.compile(lambda a: torch.softmax(a, -1), (x,))
    onnx_cm = autofusion.compile(_onnx_softmax(3))
    assert type(torch_cm) is type(onnx_cm) is autofusion.api.CompiledModel
    assert autofusion.api.CompiledOnnxModel is autofusion.api.CompiledModel
    for cm, capture in ((torch_cm, ("strict", "non-strict")), (onnx_cm, ("onnx",))):
        torch.testing.assert_close(cm(x), torch.softmax(x, -1))
        assert isinstance(cm.last, autofusion.api.CompiledGraph) and cm.last is cm.compiled
        assert cm.graph is cm.last.graph and cm.stats["capture"] in capture
        assert cm.stats["signatures"] == 1 and cm.stats["generated_calls"] >= 1
        assert cm.events and all(e in cm.events for e in cm.decisions)
        assert len(cm.input_names) == 1
    assert onnx_cm.input_names == ["x"] and onnx_cm.source.name == "<bytes>"


def test_last_says_what_the_last_signature_became() -> None:
    cm = autofusion.compile(lambda a: a.exp())
    assert cm.last is None and cm.compiled is None and cm.events == [] and cm.input_names == []
    with pytest.raises(RuntimeError, match="nothing compiled yet"):
        _ = cm.graph
    x = torch.randn(4)
    cm(x)
    assert isinstance(cm.last, autofusion.api.CompiledGraph)
    sparse = autofusion.compile(lambda a: a * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: sparse CSR support is in beta
        s = torch.eye(3).to_sparse_csr()
    sparse(s)
    assert isinstance(sparse.last, str) and "layout" in sparse.last and sparse.compiled is None
    assert sparse.stats["eager_fallback"] == sparse.last
    # An ONNX model with a dynamic dim has nothing compiled until the first call; no eager route.
    dyn = autofusion.compile(_onnx_softmax("batch"))
    assert dyn.last is None and dyn.source.eager is None
    with pytest.raises(RuntimeError, match="dynamic input dims"):
        _ = dyn.graph
    for batch in (2, 5):
        y = torch.randn(batch, 8)
        torch.testing.assert_close(dyn(y), torch.softmax(y, -1))
        assert dyn.last is dyn.compiled and dyn.graph.inputs[0].value.type.shape == (batch, 8)
    assert dyn.stats["signatures"] == 2
