"""Makes tests/dfx/dfx_test_models.py importable as MODEL `dfx_test_models:<factory>`."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _models_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def _compute_ops(kernel) -> list[str]:
    from autofusion.plan.schedule import NO_TRAFFIC

    return [n.op for n in kernel.nodes if n.op not in NO_TRAFFIC]


@pytest.fixture
def plant_wrong_fused_tanh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-only fault: a kernel that fuses tanh with any other op computes 1.001 * tanh. Kernels that
    hold tanh alone stay right, so the fault appears only with the merge that joins tanh to a neighbour."""
    from autofusion.codegen.cpp import render

    original = render.render_kernel

    def wrong(k, tile, *rest):
        text, params = original(k, tile, *rest)
        ops = _compute_ops(k)
        if "tanh" in ops and len(ops) > 1:
            text = text.replace("af_tanh(", "1.001f * af_tanh(")
        return text, params

    monkeypatch.setattr(render, "render_kernel", wrong)


@pytest.fixture
def plant_slow_fused_tanh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-only fault: a kernel that fuses tanh with another op first spins for ~10^8 additions
    (tens of ms, against microseconds for the whole model), so only that merge makes the model slower."""
    from autofusion.codegen.cpp import render

    original = render.render_kernel

    def slow(k, tile, *rest):
        text, params = original(k, tile, *rest)
        ops = _compute_ops(k)
        if "tanh" in ops and len(ops) > 1:
            spin = "  { volatile float s = 0; for (long i = 0; i < 100000000L; ++i) s = s + 1.0f; }\n"
            head, _, body = text.partition("{\n")
            text = head + "{\n" + spin + body
        return text, params

    monkeypatch.setattr(render, "render_kernel", slow)


@pytest.fixture
def plant_wrong_fused_tanh_and_sigmoid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two test-only faults: fused tanh and fused sigmoid are each 0.1 % off (two culprit merges)."""
    from autofusion.codegen.cpp import render

    original = render.render_kernel

    def wrong(k, tile, *rest):
        text, params = original(k, tile, *rest)
        ops = _compute_ops(k)
        if len(ops) > 1:
            for op in ("tanh", "sigmoid"):
                if op in ops:
                    text = text.replace(f"af_{op}(", f"1.001f * af_{op}(")
        return text, params

    monkeypatch.setattr(render, "render_kernel", wrong)


@pytest.fixture
def plant_wrong_linear_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-only fault in a fusion rule: the `linear_residual` rule's library call (runtime/library.py)
    returns x @ w.T + b + 1.001 * other. Everything else, fused or not, stays right."""
    from autofusion.ir.interpret import PY_TARGETS
    from autofusion.runtime import library

    original = library.linear_residual

    def wrong(x, w, b, other, ln_w, ln_b):  # type: ignore[no-untyped-def]
        return original(x, w, b, other * 1.001, ln_w, ln_b)

    monkeypatch.setattr(library, "linear_residual", wrong)
    monkeypatch.setitem(PY_TARGETS, f"{library.NAMESPACE}.linear_residual.default", wrong)


@pytest.fixture
def plant_wrong_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test-only fault in a graph pass: `algebraic_simplify` also turns every literal 0.5 into 0.5005."""
    import dataclasses

    from autofusion import compiler as pipeline

    original = pipeline.graph_passes

    def wrong_simplify(simplify):  # type: ignore[no-untyped-def]
        def run(g):  # type: ignore[no-untyped-def]
            g = simplify(g)
            nodes = tuple(
                dataclasses.replace(
                    n, attrs=tuple((k, 0.5005 if k == "value" and v == 0.5 else v) for k, v in n.attrs)
                )
                if n.op == "full" and n.attr("value") == 0.5
                else n
                for n in g.nodes
            )
            return g.replace(nodes=nodes)

        return run

    def passes(*args, **kw):  # type: ignore[no-untyped-def]
        return [
            (name, wrong_simplify(fn) if name == "algebraic_simplify" else fn)
            for name, fn in original(*args, **kw)
        ]

    monkeypatch.setattr(pipeline, "graph_passes", passes)
