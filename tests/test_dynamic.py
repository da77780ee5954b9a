"""Shapes that change: torch.compile graphs with symbolic sizes are specialised per call signature (never
run eagerly), the direct API's `dynamic=` contract, guards that never reuse a plan made for other
shapes, dtypes or strides, the bounded signature cache, ONNX symbolic dims, SuperKernel and poison."""

from __future__ import annotations

import io
import logging

import pytest
import torch
from torch.export import Dim

import autofusion
from autofusion.api import CompiledGraph
from autofusion.backend import Specialized, autofusion_backend
from autofusion.errors import InputMismatchError
from autofusion.signatures import SignatureCache


class Block(torch.nn.Module):
    """A small pre-norm transformer block: the shape-changing workload the backend must keep compiled."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.att = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.att(y, y, y, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # view with the batch size: Dynamo passes it as a SymInt input once the batch is dynamic
        return torch.relu(self.fc(x)).view(x.shape[0], -1) * 2 + x.sum(-1, keepdim=True)


def _recorder(seen: list, **options):
    def backend(gm, example_inputs):
        fn = autofusion_backend(gm, example_inputs, options=options)
        seen.append(fn)
        return fn

    return backend


def _eager_graphs(seen: list) -> list:
    return [fn for fn in seen if fn.autofusion_graph is None]


def test_default_dynamic_batches_32_7_13_never_run_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    m = Mlp().eval()
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(m, backend=_recorder(seen))
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="autofusion.signatures"):
        for batch in (32, 7, 13, 7, 32):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(fn(x), m(x))
    assert "eagerly" not in caplog.text
    assert not _eager_graphs(seen), [f.autofusion_stats() for f in seen]
    # Dynamo: a static graph for 32 (planned through a symbolic capture all the same), then one
    # symbolic graph for every later batch; its guards are checked first, so the last call (32 again)
    # goes to the symbolic graph too.
    assert len(seen) == 2 and all(isinstance(f, Specialized) for f in seen)
    assert seen[0].traced_static and not seen[1].traced_static
    stats = seen[1].autofusion_stats()
    assert stats["signatures_planned"] == 3 and stats["signatures"] == 3  # 7, 13, 32: each planned once
    # 7 was planned when Dynamo handed over the graph: its first call and the second 7 found the plan.
    assert stats["signature_hits"] == 2
    assert stats["generated_calls"] >= 1 and "build_error" not in stats
    # 32 in the static graph (a signature of its symbolic capture), then 7, 13 and 32 in the other.
    assert caplog.text.count("planned a new input signature") == 4


def test_dynamic_true_plans_each_shape_once_and_reuses_the_library() -> None:
    m = Block().eval()
    torch._dynamo.reset()
    seen: list = []
    # Freezing off: which GEMMs take a prepacked weight (and so leave the generated source) is measured
    # per shape, and a measurement may choose differently for two shapes.
    fn = torch.compile(m, backend=_recorder(seen, freeze=False), dynamic=True)
    with torch.no_grad():
        for b, t in ((2, 5), (3, 7), (2, 5), (2, 9), (3, 7)):  # (size 1 is a Dynamo graph of its own)
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-5)
    assert not _eager_graphs(seen)
    (spec,) = [f for f in seen if isinstance(f, Specialized)]
    stats = spec.autofusion_stats()
    assert stats["signatures_planned"] == 3 and stats["signatures"] == 3
    # The generated code takes sizes at call time: plans of one loop structure render one source
    # (so the build cache hands every specialisation the same library).
    sources = {g.program.source for g in spec.cache.values() if isinstance(g, CompiledGraph)}
    assert len(sources) == 1


def test_a_specialisation_never_reuses_a_plan_of_other_dtype_or_strides() -> None:
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(
        lambda a: (a * 2).sin() + a.sum(-1, keepdim=True), backend=_recorder(seen), dynamic=True
    )
    ref = lambda a: (a * 2).sin() + a.sum(-1, keepdim=True)  # noqa: E731
    with torch.no_grad():
        x = torch.randn(5, 6)
        torch.testing.assert_close(fn(x), ref(x))
        xt = torch.randn(6, 5).t()  # the same shape, other strides
        torch.testing.assert_close(fn(xt), ref(xt))
        xd = torch.randn(5, 6, dtype=torch.float64)
        torch.testing.assert_close(fn(xd), ref(xd))
        torch.testing.assert_close(fn(x), ref(x))
    assert not _eager_graphs(seen)
    # Each of the three (shape, strides, dtype) facts planned once, wherever Dynamo sent it; the last
    # call found its plan.
    planned = sum(f.autofusion_stats().get("signatures_planned", 1) for f in seen)
    assert planned == 3, [f.autofusion_stats() for f in seen]


def test_rank_change_recompiles_through_dynamo() -> None:
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(lambda a: torch.softmax(a * 3, -1), backend=_recorder(seen))
    with torch.no_grad():
        for shape in ((4, 8), (5, 8), (2, 3, 8), (6, 8), (2, 4, 8)):
            x = torch.randn(shape)
            torch.testing.assert_close(fn(x), torch.softmax(x * 3, -1))
    assert not _eager_graphs(seen)


def test_signature_cache_is_bounded_and_replans_an_evicted_shape(caplog: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(lambda a: (a + 1).tanh(), backend=_recorder(seen, max_signatures=2), dynamic=True)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="autofusion.signatures"):
        for n in (3, 4, 5, 3):
            x = torch.randn(n, 2)
            torch.testing.assert_close(fn(x), (x + 1).tanh())
    (spec,) = seen
    stats = spec.autofusion_stats()
    assert stats["signatures"] == 2 and stats["signatures_evicted"] == 2 and stats["signatures_planned"] == 4
    assert "dropped the least recently used" in caplog.text


def test_signature_cache_counts() -> None:
    cache: SignatureCache[str] = SignatureCache(2, "test")
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # now "b" is the least recently used
    cache.put("c", "C")
    assert "b" not in cache and "a" in cache and cache.get("b") is None
    assert cache.stats() == {"signatures": 2, "signatures_planned": 3, "signature_hits": 1,
                             "signatures_evicted": 1}  # fmt: skip
    with pytest.raises(ValueError, match="max_signatures"):
        SignatureCache(0, "test")


@pytest.mark.parametrize(
    "options", [{"super_kernel": "on"}, {"poison": True}, {"super_kernel": "on", "poison": True}]
)
def test_specialisations_with_super_kernel_and_poison(options: dict) -> None:
    m = Block().eval()
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(m, backend=_recorder(seen, **options), dynamic=True)
    with torch.no_grad():
        for b, t in ((2, 6), (2, 3), (4, 6)):
            x = torch.randn(b, t, 32)
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-5)
    (spec,) = seen
    stats = spec.autofusion_stats()
    assert stats["signatures_planned"] == 3 and "build_error" not in stats
    if options.get("super_kernel") == "on":
        arenas = []
        for g in spec.cache.values():
            assert isinstance(g, CompiledGraph) and g.stats()["super_kernel"]["on"]
            arenas.append(g.stats()["super_kernel"]["arena_bytes"])
        assert arenas[2] > arenas[0] > arenas[1]  # each plan's arena is sized for its own shapes


def test_capture_failure_of_one_signature_runs_that_signature_eagerly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import autofusion.backend
    from autofusion.errors import FrontendError

    real = autofusion.backend.capture

    def refuse_five(module, inputs, *args, **kwargs):
        if inputs[0].shape[0] == 5:
            raise FrontendError("could not capture the model: refused by the test")
        return real(module, inputs, *args, **kwargs)

    monkeypatch.setattr(autofusion.backend, "capture", refuse_five)
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(lambda a: a.cos() * 2, backend=_recorder(seen), dynamic=True)
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        for n in (4, 5, 6):
            x = torch.randn(n, 3)
            torch.testing.assert_close(fn(x), x.cos() * 2)
    (spec,) = seen
    assert "refused by the test" in caplog.text and spec.autofusion_graph is not None  # 6 ran compiled
    assert sum(isinstance(e, str) for e in spec.cache.values()) == 1


# -- the direct API -------------------------------------------------------------------------------


def _f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin() + y


def test_direct_api_dynamic_dims_are_planned_and_static_dims_refused() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    cm = autofusion.compile(_f, [x, y], dynamic={"x": {0: "batch"}, "y": {0: "batch"}})
    for n in (6, 2, 6):
        a, b = torch.randn(n, 8), torch.randn(n, 8)
        torch.testing.assert_close(cm(a, b), _f(a, b))
    assert cm.stats["signatures"] == 3 and cm.stats["signatures_planned"] == 3
    with pytest.raises(InputMismatchError, match="dim 1 is 9; it is static"):
        cm(torch.randn(6, 9), torch.randn(6, 9))
    with pytest.raises(InputMismatchError, match="both are dim 'batch'"):
        cm(torch.randn(6, 8), torch.randn(5, 8))
    with pytest.raises(InputMismatchError, match="rank 3"):
        cm(torch.randn(6, 8, 1), torch.randn(6, 8))
    assert cm.stats["signatures_planned"] == 3  # the refused calls planned nothing


def test_direct_api_export_dims_with_ranges_and_sequence_form() -> None:
    batch = Dim("batch", min=2, max=8)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    cm = autofusion.compile(_f, [x, y], dynamic=({0: batch}, {0: batch}))
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(cm(a, b), _f(a, b))
    with pytest.raises(InputMismatchError, match=r"outside the range \[2, 8\]"):
        cm(torch.randn(9, 8), torch.randn(9, 8))
    auto = autofusion.compile(_f, [x, y], dynamic={"x": {1: Dim.AUTO}, "y": {1: Dim.DYNAMIC}})
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    torch.testing.assert_close(auto(a, b), _f(a, b))


def test_direct_api_dynamic_false_true_and_bad_specs() -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    static = autofusion.compile(_f, [x, y], dynamic=False)
    with pytest.raises(InputMismatchError, match="dim 0 is 5; it is static"):
        static(torch.randn(5, 8), torch.randn(5, 8))
    anything = autofusion.compile(_f, [x, y], dynamic=True)
    for shape in ((5, 8), (2, 3, 1)):
        a, b = torch.randn(shape), torch.randn(shape)
        torch.testing.assert_close(anything(a, b), _f(a, b))
    assert anything.stats["signatures_planned"] == 3
    with pytest.raises(ValueError, match="no input 'z'"):
        autofusion.compile(_f, [x, y], dynamic={"z": {0: "b"}})
    with pytest.raises(ValueError, match="no dim 2"):
        autofusion.compile(_f, [x, y], dynamic={"x": {2: "b"}})
    with pytest.raises(ValueError, match="give a dim name"):
        autofusion.compile(_f, [x, y], dynamic={"x": {0: 3.5}})
    # Without example inputs the first call fixes the static dims.
    late = autofusion.compile(_f, dynamic={"x": {0: "n"}, "y": {0: "n"}})
    a, b = torch.randn(3, 2), torch.randn(3, 2)
    torch.testing.assert_close(late(a, b), _f(a, b))
    with pytest.raises(InputMismatchError, match="dim 1 is 4"):
        late(torch.randn(3, 4), torch.randn(3, 4))


def _onnx_relu(dim: str) -> bytes:
    buf = io.BytesIO()

    class M(torch.nn.Module):
        def forward(self, a: torch.Tensor) -> torch.Tensor:
            return torch.relu(a) * 3 + a.mean(-1, keepdim=True)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(M(), (torch.randn(2, 5),), buf, input_names=["a"], dynamic_axes={"a": {0: dim}},
                          dynamo=False)  # fmt: skip
    return buf.getvalue()


def test_onnx_symbolic_dims_run_for_two_sizes_with_a_contract() -> None:
    model = _onnx_relu("n")
    cm = autofusion.compile(model, dynamic={"a": {0: "n"}})
    for n in (2, 7, 2):
        a = torch.randn(n, 5)
        torch.testing.assert_close(cm(a), torch.relu(a) * 3 + a.mean(-1, keepdim=True))
    assert cm.stats["signatures"] == 2 and cm.stats["signatures_planned"] == 2
    assert cm.stats["generated_calls"] >= 1


def test_mark_dynamic_first_graph_is_specialised() -> None:
    m = Mlp().eval()
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(m, backend=_recorder(seen))
    x = torch.randn(6, 16)
    torch._dynamo.mark_dynamic(x, 0)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x))
        for n in (3, 9):
            y = torch.randn(n, 16)
            torch.testing.assert_close(fn(y), m(y))
    assert len(seen) == 1 and isinstance(seen[0], Specialized)
    assert seen[0].autofusion_stats()["signatures_planned"] == 3


def test_direct_api_module_inputs_by_forward_name() -> None:
    m = Mlp().eval()
    with torch.no_grad():
        cm = autofusion.compile(m, [torch.randn(4, 16)], dynamic={"x": {0: Dim("batch", min=1)}})
        for n in (1, 7):
            x = torch.randn(n, 16)
            torch.testing.assert_close(cm(x), m(x))
        assert cm.stats["signatures_planned"] == 3 and cm.stats["signatures"] == 3
        with pytest.raises(InputMismatchError, match="dim 1 is 8; it is static"):
            cm(torch.randn(2, 8))
        small = autofusion.compile(m, [torch.randn(4, 16)], dynamic={"x": {0: "b"}}, max_signatures=1)
        for n in (2, 3, 2):
            x = torch.randn(n, 16)
            torch.testing.assert_close(small(x), m(x))
        assert small.stats["signatures"] == 1 and small.stats["signatures_evicted"] == 3


def test_direct_api_ignores_mark_dynamic_marks_on_the_inputs() -> None:
    x = torch.randn(6, 4)
    torch._dynamo.mark_dynamic(x, 0)  # the model fixes dim 0 below: export would refuse the mark
    cm = autofusion.compile(lambda a: a.view(6, 4).sin(), [x])
    assert "eager_fallback" not in cm.stats
    torch.testing.assert_close(cm(x), x.sin())


class _CacheWrite(torch.nn.Module):
    """A decode-style step: writes one row of a cache input in place, then reads the cache."""

    def forward(self, cache: torch.Tensor, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(1, pos, x)
        return cache.sum(1) * 2


def test_symbolic_graph_that_mutates_an_input_is_compiled_and_writes_in_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The first signature is planned while Dynamo is still compiling; torch.export used to pick up
    # Dynamo's guards there and fail on them ("name 'L' is not defined"), running the graph eagerly.
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(_CacheWrite(), backend=_recorder(seen))
    with torch.no_grad(), caplog.at_level(logging.WARNING):
        for batch in (4, 3, 5, 3):
            cache, x, pos = torch.zeros(batch, 16, 8), torch.randn(batch, 1, 8), torch.tensor([batch])
            want_cache = cache.clone().index_copy_(1, pos, x)
            got = fn(cache, x, pos)
            torch.testing.assert_close(got, want_cache.sum(1) * 2)
            assert torch.equal(cache, want_cache)
    assert "eagerly" not in caplog.text
    assert any(isinstance(f, Specialized) for f in seen) and not _eager_graphs(seen)
    assert all(f.autofusion_stats().get("generated_calls", 0) >= 1 for f in seen)


def test_grad_mode_with_symbolic_sizes_runs_compiled_or_names_autograd() -> None:
    # Dynamo passes SymInt sizes among the example inputs; the autograd check must skip them.
    m = Mlp().eval()
    torch._dynamo.reset()
    seen: list = []
    fn = torch.compile(m, backend=_recorder(seen))
    for batch in (6, 5, 9):  # grad mode on, parameters require grad: eager, with the reason
        x = torch.randn(batch, 16)
        torch.testing.assert_close(fn(x), m(x))
    assert seen and all(f.autofusion_graph is None for f in seen)
    m.requires_grad_(False)
    torch._dynamo.reset()
    seen.clear()
    fn = torch.compile(m, backend=_recorder(seen))
    for batch in (6, 5, 9):  # nothing requires grad: compiled, symbolic sizes included
        x = torch.randn(batch, 16)
        torch.testing.assert_close(fn(x), m(x))
    assert any(isinstance(f, Specialized) for f in seen) and not _eager_graphs(seen)


class _ReluSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + x.sum(-1, keepdim=True)


def test_direct_api_dynamic_dims_take_another_dtype_for_itself() -> None:
    # The symbolic capture is of float32 inputs: a float64 call of another size is captured for itself
    # (instantiating the float32 template gave float32 results).
    m = _ReluSum()
    cm = autofusion.compile(m, [torch.randn(3, 6)], dynamic={"x": {0: "batch"}})
    with torch.no_grad():
        for x in (torch.randn(3, 6), torch.randn(4, 6), torch.randn(5, 6).double()):
            out = cm(x)
            assert out.dtype is x.dtype
            torch.testing.assert_close(out, m(x))
    sym = cm.stats["torch_symbolic"]
    assert sym["instantiations"] == 2 and any("float64" in w for w in sym["captured_for_themselves"]), sym
