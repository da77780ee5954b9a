"""The options `autofusion tune` searches beyond the fusion switches (tile parameters, kernel threads,
conv layouts per chain, the linears' library route, GEMMs in or out of SuperKernels): each really
changes the generated code, the plan or the route that runs, results stay eager's, a record may set
them, and the search offers them. Nothing here asserts a speed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autofusion
from autofusion import tuning
from autofusion.cache import Cache
from autofusion.config import Options
from autofusion.passes import layout
from autofusion.runtime import dnnl_route, library, prepack
from autofusion.tools.tune import search

ONEDNN = torch.backends.mkldnn.is_available()


def _compile(model: nn.Module, xs: list[torch.Tensor], tmp_path, **options):  # type: ignore[no-untyped-def]
    cm = autofusion.compile(model, xs, cache_dir=str(tmp_path), tuning="off", **options)
    with torch.no_grad():
        torch.testing.assert_close(cm(*xs), model(*xs), rtol=1e-4, atol=1e-4)
    return cm


def _program(cm):  # type: ignore[no-untyped-def]
    return cm.compiled.program


class Norm(nn.Module):
    """Reductions run as rows (layer norm over the last dim) and a pointwise tail."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (x.shape[-1],)) * 2.0 + torch.sin(x)


class Pointwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2.0 + 1.0


class ColumnSum(nn.Module):
    """A reduction over dim 0 of a row-major matrix: it runs as columns (kernel/tile.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 3.0).sum(0)


class TwoChains(nn.Module):
    """Two chains of convolutions: a generated kernel (sin) between them breaks the chain."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sin(self.a(x)))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 128), nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)) * 0.5)


def _seeded(model: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return model.eval()


def test_options_refuse_bad_knob_values() -> None:
    with pytest.raises(ValueError, match="tile_inner_block"):
        Options(tile_inner_block=-1)
    with pytest.raises(ValueError, match="kernel_threads"):
        Options(kernel_threads=-2)
    with pytest.raises(ValueError, match="conv_layout"):
        Options(conv_layout="nhwc")
    with pytest.raises(ValueError, match="linear_route"):
        Options(linear_route="cublas")
    with pytest.raises(ValueError, match="NODE=LAYOUT"):
        Options(conv_chain_layouts=("conv=auto",))
    with pytest.raises(TypeError):
        Options(kernel_threads="2")  # type: ignore[arg-type]
    assert Options(conv_chain_layouts="conv=blocked").conv_chain_layouts == ("conv=blocked",)
    assert "num_threads" in Options().help()["kernel_threads"]


def test_rows_per_block_changes_the_plans_parameters_not_the_library(tmp_path) -> None:
    model, xs = _seeded(Norm()), [torch.randn(64, 96)]
    base = _compile(model, xs, tmp_path)
    ones = _compile(model, xs, tmp_path, tile_rows_per_block=1)
    reductions = [s for s in _program(ones).plan.kernels if s.kernel.is_reduction]
    assert reductions and all(s.tile.rows_per_block == 1 for s in reductions)
    assert any(s.tile.rows_per_block != 1 for s in _program(base).plan.kernels if s.kernel.is_reduction)
    # Rows per block is a parameter of the kernel, not of its source: the same library serves both.
    assert _program(ones).source == _program(base).source and _program(ones).stats["cache_hit"]
    assert _program(ones).params != _program(base).params
    assert search.plan_key(ones) != search.plan_key(base)
    assert ones.stats["generated_calls"] >= 1


def test_inner_block_splits_pointwise_kernels_and_resizes_column_blocks(tmp_path) -> None:
    model, xs = _seeded(Pointwise()), [torch.randn(64, 96)]
    base = _compile(model, xs, tmp_path)
    small = _compile(model, xs, tmp_path, tile_inner_block=256)
    pointwise = [s for s in _program(small).plan.kernels if not s.kernel.is_reduction]
    assert pointwise and all(s.tile.inner_block == 256 for s in pointwise)
    assert all(s.tile.inner_block != 256 for s in _program(base).plan.kernels)
    assert _program(small).params != _program(base).params and small.stats["generated_calls"] >= 1
    cols, ys = _seeded(ColumnSum()), [torch.randn(300, 200)]
    base = _compile(cols, ys, tmp_path)
    forced = _compile(cols, ys, tmp_path, tile_inner_block=64)
    (k_base,) = [s for s in _program(base).plan.kernels if s.tile.columns]
    (k_forced,) = [s for s in _program(forced).plan.kernels if s.tile.columns]
    assert k_forced.tile.inner_block == 64 != k_base.tile.inner_block
    # The column block is a literal of the source: another library (the build cache keys on the source).
    assert _program(forced).source != _program(base).source and not _program(forced).stats["cache_hit"]
    assert forced.stats["generated_calls"] >= 1


def test_kernel_threads_is_a_num_threads_clause_in_every_parallel_region(tmp_path) -> None:
    model, xs = _seeded(Norm()), [torch.randn(256, 512)]
    base = _compile(model, xs, tmp_path)
    one = _compile(model, xs, tmp_path, kernel_threads=1)
    assert "num_threads" not in _program(base).source
    src = _program(one).source
    assert "#pragma omp parallel num_threads(1)" in src
    assert src.count("#pragma omp parallel num_threads(1)") == src.count("#pragma omp parallel")
    assert not _program(one).stats["cache_hit"] and one.stats["generated_calls"] >= 1
    sk = _compile(model, xs, tmp_path, kernel_threads=1, super_kernel="on")
    assert sk.stats["super_kernel"]["on"] and "#pragma omp parallel num_threads(1)" in _program(sk).source
    assert "#pragma omp parallel\n" not in _program(sk).source


def test_kernel_threads_reaches_the_gemv_helpers_own_region(tmp_path) -> None:
    """A decode step's one-row linears run as the entry's GEMV (codegen/cpp/gemv.py), whose stand-alone
    `af_gemv` opens a region of its own: it takes the same team size as the kernels' regions."""
    model, xs = _seeded(Mlp()), [torch.randn(1, 64)]
    base = _compile(model, xs, tmp_path, super_kernel="on", builtin_rules=False)
    one = _compile(model, xs, tmp_path, super_kernel="on", builtin_rules=False, kernel_threads=1)
    assert "#pragma omp parallel if (N * K >= AF_GEMV_PAR_MIN)" in _program(base).source
    src = _program(one).source
    assert "#pragma omp parallel num_threads(1) if (N * K >= AF_GEMV_PAR_MIN)" in src
    assert src.count("#pragma omp parallel num_threads(1)") == src.count("#pragma omp parallel")
    lib = _program(one).library
    before = lib.af_gemv_calls()
    with torch.no_grad():
        torch.testing.assert_close(one(*xs), model(*xs), rtol=1e-4, atol=1e-4)
    assert lib.af_gemv_calls() - before == 2  # both linears ran as the generated GEMV


def _routes(cm) -> list[str]:  # type: ignore[no-untyped-def]
    """The route literal of each routed convolution in the plan (plain NCHW convs: 'aten')."""
    out = []
    for n in _program(cm).plan.graph.nodes:
        if n.op == "conv":
            out.append("aten")
        elif n.op == "extern" and n.attr("target") == layout.CONV_TARGET:
            out.append(n.attr("args")[14] if len(n.attr("args")) == 16 else "aten")
    return out


def _ran(cm, xs: list[torch.Tensor]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    before = dict(library.ROUTE_CALLS)
    with torch.no_grad():
        cm(*xs)
    return {k: v - before.get(k, 0) for k, v in library.ROUTE_CALLS.items() if v - before.get(k, 0)}


@pytest.mark.parametrize("forced", ["nchw", "channels_last", "blocked", "dnnl"])
def test_conv_layout_forces_every_chains_route(tmp_path, forced: str) -> None:
    if forced == "blocked" and not ONEDNN:
        pytest.skip("this torch build has no oneDNN")
    if forced == "dnnl" and not dnnl_route.available():
        pytest.skip("oneDNN's library (onednn-cpu-gomp) or its headers are not installed")
    model, xs = _seeded(TwoChains()), [torch.randn(2, 3, 12, 10)]
    cm = _compile(model, xs, tmp_path, conv_layout=forced)
    want = layout.LAYOUT_ROUTES[forced]
    assert _routes(cm) == [want, want]
    if want != "aten":
        assert _ran(cm, xs) == {want: 2}
    assert cm.stats["generated_calls"] >= 1  # the sin between the chains is a generated kernel


def test_conv_chain_layouts_route_one_chain(tmp_path) -> None:
    model, xs = _seeded(TwoChains()), [torch.randn(2, 3, 12, 10)]
    nchw = _compile(model, xs, tmp_path, conv_layout="nchw")
    chains = layout.conv_chains(_program(nchw).plan.graph)
    assert len(chains) == 2 and all(len(c) == 1 for c in chains)
    second = chains[1][0]
    cm = _compile(model, xs, tmp_path, conv_layout="nchw", conv_chain_layouts=(f"{second}=channels_last",))
    assert _routes(cm) == ["aten", "aten_cl"]
    assert _ran(cm, xs) == {"aten_cl": 1}
    # The chains of a routed plan are found again by the same names (what tune's knobs name).
    assert layout.conv_chains(_program(cm).plan.graph) == chains


def test_linear_route_forces_the_prepack_choice(tmp_path) -> None:
    model, xs = _seeded(Mlp()), [torch.randn(16, 64)]
    plain = _compile(model, xs, tmp_path, linear_route="plain", super_kernel="off")
    assert plain.stats["prepacked"] == {}
    for route in ("onednn", "mkl"):
        if not prepack.available(route, torch.float32):
            continue
        cm = _compile(model, xs, tmp_path, linear_route=route, super_kernel="off")
        assert cm.stats["prepacked"] and set(cm.stats["prepacked"].values()) == {route}
        assert search.plan_key(cm) != search.plan_key(plain)
    chooser = prepack.RouteChooser(None, "mkl")
    assert chooser(4, 8, 8, torch.float16) == "plain"  # a route the dtype lacks runs plain
    with pytest.raises(ValueError, match="linear route"):
        prepack.RouteChooser(None, "fast")


def test_super_kernel_gemm_off_splits_scopes_at_gemms(tmp_path) -> None:
    model, xs = _seeded(Mlp()), [torch.randn(16, 64)]
    inside = _compile(
        model, xs, tmp_path, linear_route="plain", super_kernel="on", disabled={"gemm_epilogue"}
    )
    sk = inside.stats["super_kernel"]
    if not sk["on"] or sk["library_calls_inside"] == 0:
        pytest.skip(f"no in-entry sgemm here: {sk}")
    out = _compile(model, xs, tmp_path, linear_route="plain", super_kernel="on", disabled={"gemm_epilogue"},
                   super_kernel_gemm=False)  # fmt: skip
    so = out.stats["super_kernel"]
    assert so["on"] and so["library_calls_inside"] == 0
    assert search.plan_key(out) != search.plan_key(inside)
    assert out.stats["generated_calls"] >= 1


def test_a_record_sets_the_new_knobs(tmp_path) -> None:
    model, xs = _seeded(Norm()), [torch.randn(64, 96)]
    plain = _compile(model, xs, tmp_path)
    overrides = {"kernel_threads": 1, "tile_rows_per_block": 1, "conv_chain_layouts": ["c=blocked"]}
    record = tuning.TuningRecord(tuning.graph_hash(plain.graph), tuning.machine_fingerprint(), overrides,
                                 2.0, 1.0)  # fmt: skip
    tuning.store(record, Cache(tmp_path))
    tuned = autofusion.compile(model, xs, cache_dir=str(tmp_path))
    assert "num_threads(1)" in _program(tuned).source
    assert all(s.tile.rows_per_block == 1 for s in _program(tuned).plan.kernels if s.kernel.is_reduction)
    # Per-chain layouts add to the caller's; the caller's entry for a chain wins.
    mine = Options(conv_chain_layouts=("c=nchw", "d=nchw"))
    applied = tuning.apply(tuning.TuningRecord("g", "m", {"conv_chain_layouts": ["c=blocked", "e=blocked"]},
                                               2.0, 1.0), mine)  # fmt: skip
    assert applied.conv_chain_layouts == ("c=nchw", "d=nchw", "e=blocked")
    assert tuning.overrides_json({"conv_chain_layouts": ("a=nchw",)}) == {"conv_chain_layouts": ["a=nchw"]}


def test_knobs_offer_tiles_threads_routes_and_layouts_per_chain() -> None:
    labels = [k.label for k in search.knobs(Options(), {})]
    for want in ("tile_inner_block=1024", "tile_rows_per_block=1", "linear_route=plain",
                 "super_kernel_gemm=False", "conv_layout=blocked"):  # fmt: skip
        assert want in labels
    if torch.get_num_threads() > 1:
        assert "kernel_threads=1" in labels
    # Knobs that cannot change the incumbent's plan are not offered: no convolutions, no layout knobs;
    # no kernels, no tile or thread knobs; a rule that matched nothing is not switched off.
    bare = [k.label for k in search.knobs(Options(), {}, search.PlanFacts(kernels=False, gemms=False))]
    assert not any(lb.startswith(("conv_layout", "tile_", "kernel_threads", "linear_route")) for lb in bare)
    assert "rule conv_bn off" not in bare and "pass cse off" not in bare and "pass gemm_epilogue off" in bare
    facts = search.PlanFacts(
        chains=(("a",), ("b", "c")), rules=frozenset({"conv_bn"}), passes=frozenset({"cse"})
    )
    offered = search.knobs(Options(), {}, facts)
    assert "rule conv_bn off" in [k.label for k in offered] and "pass cse off" in [k.label for k in offered]
    per_chain = [k for k in offered if k.option == "conv_chain_layouts"]
    assert len(per_chain) == 2 * len(search.CONV_LAYOUTS) and per_chain[0].value == ("a=nchw",)
    wins = [
        search.Evaluation("x", "conv_chain_layouts", None, {"conv_chain_layouts": ("b=blocked",)}, "timed"),
        search.Evaluation("y", "conv_chain_layouts", None, {"conv_chain_layouts": ("a=nchw",)}, "timed"),
    ]
    merged = search.combine({"conv_chain_layouts": ("a=channels_last",)}, wins)
    assert merged["conv_chain_layouts"] == ("a=nchw", "b=blocked")
    # From an incumbent, the knob of its own value is not offered again.
    again = [k.label for k in search.knobs(Options(), {"tile_inner_block": 1024, "linear_route": "plain"})]
    assert "tile_inner_block=1024" not in again and "linear_route=plain" not in again
    assert "tile_inner_block=16384" in again


def test_a_record_may_set_every_option_the_search_changes() -> None:
    facts = search.PlanFacts(chains=(("a",), ("b",)), rules=frozenset({"conv_bn"}), passes=frozenset({"cse"}))
    options = {k.option for k in search.knobs(Options(), {}, facts)}
    assert options <= tuning.TUNABLE, options - tuning.TUNABLE
    assert {"conv_chain_layouts", "kernel_threads", "tile_inner_block", "linear_route"} <= options
