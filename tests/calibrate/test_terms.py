"""The cost model's terms (fusion/terms.py, fusion/cost.py): liveness, op weights, negative ILP, spills,
tile overhead, and Benefit.net as the difference of the estimated kernel times."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autofusion.codegen.cpp.render import supports
from autofusion.fusion import terms
from autofusion.fusion.cost import estimate, merge_benefit
from autofusion.hw.profile import load_profile
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import GraphBuilder
from autofusion.ir.types import TensorType
from autofusion.kernel.lower import LoopKernel, lower_group
from autofusion.kernel.tile import choose_tile
from autofusion.tools.calibrate.micro import _chain, _spill

CPU = load_profile("cpu", measure=False)
H200 = load_profile("h200", measure=False)
ASCEND = load_profile("ascend910b", measure=False)


def _bcast_pieces() -> tuple[LoopKernel, LoopKernel, LoopKernel]:
    """Eight exp -> sin over [256], then a broadcast add over [256, 1024]: fused, they run per element."""
    b = GraphBuilder("bcast")
    x = b.add_input(TensorType(DType.float32, (256,)), "x")
    y = b.add_input(TensorType(DType.float32, (256, 1024)), "y")
    s = x
    for _ in range(8):
        s = b.add("sin", (b.add("exp", (s,)),))
    col = b.add("reshape", (s,), {"shape": (256, 1)})
    out = b.add("add", (col, y))
    g = b.build([out])
    types = g.value_types()
    nodes = list(g.nodes)
    ka = lower_group("a", nodes[:16], [x], [s], types, supports)
    kb = lower_group("b", nodes[16:], [s, y], [out], types, supports)
    kf = lower_group("f", nodes, [x, y], [out], types, supports)
    return ka, kb, kf


def test_liveness_counts_values_defined_and_still_used() -> None:
    # a chain keeps x, y and the running value: 3, however long it is
    assert terms.live_values(_chain("c", DType.float32, 64, ("mul", "add") * 10)) == 3
    # K values each used twice, the second time after all were made: all K alive, plus x, y (or the sum)
    for k in (4, 20, 40):
        assert terms.live_values(_spill("s", 64, k)) == k + 2
    # the old proxy (every load/compute of the stage) grows with the chain; liveness does not
    long = _chain("c", DType.float32, 64, ("sin",) * 30)
    assert terms.live_values(long) <= 3 < sum(1 for s in long.stages[0] if s.kind in ("load", "compute"))


def test_op_weights_per_class_and_dtype() -> None:
    adds = _chain("a", DType.float32, 1024, ("add",) * 8)
    sines = _chain("s", DType.float32, 1024, ("sin",) * 8)
    assert terms.weighted_flops(sines, CPU) > 10 * terms.weighted_flops(adds, CPU)
    assert terms.op_class("tanh") == "transcendental" and terms.op_class("sqrt") == "div"
    tuned = dataclasses.replace(CPU, op_weights={"trig": 3.0, "arith.fp16": 2.0})
    assert terms.op_weight("sin", DType.float32, tuned) == 3.0
    assert terms.op_weight("add", DType.float16, tuned) == 2.0
    assert terms.op_weight("add", DType.float32, tuned) == terms.DEFAULT_OP_WEIGHTS["arith"]


def test_negative_ilp_when_the_fused_kernel_becomes_compute_bound() -> None:
    ka, kb, kf = _bcast_pieces()
    _, tb, tf = (terms.kernel_terms(k, choose_tile(k, CPU), CPU) for k in (ka, kb, kf))
    assert tb.compute < tb.memory  # the broadcast add alone is memory-bound
    assert tf.compute > tf.memory  # fused, exp and sin per element of y: compute-bound
    benefit = merge_benefit(ka, kb, kf, CPU)
    assert benefit.ilp_gain < 0 and benefit.net < 0
    assert "ilp_gain=-" in benefit.describe()


def test_net_is_the_difference_of_the_estimates() -> None:
    ka, kb, kf = _bcast_pieces()
    for p in (CPU, H200, ASCEND):
        est = [estimate(k, p).seconds for k in (ka, kb, kf)]
        assert merge_benefit(ka, kb, kf, p).net == pytest.approx(
            est[0] + est[1] - est[2], rel=1e-9, abs=1e-15
        )


def test_spill_term_follows_the_registers() -> None:
    wide = _spill("s", 1 << 16, 40)  # 42 live values
    few = dataclasses.replace(CPU, vector_registers=16)
    many = dataclasses.replace(CPU, vector_registers=64)
    assert terms.spilled_values(wide, few) == [42 - 16]
    assert terms.spilled_values(wide, many) == [0]
    assert terms.spilled_values(wide, H200) == [0]  # 255 registers per thread
    assert terms.spilled_values(wide, ASCEND) == [0]  # computes from UB: no register spill
    t = terms.kernel_terms(wide, choose_tile(wide, few), few)
    assert t.spill == pytest.approx(26 * (1 << 16) * terms.spill_seconds_per_value(few))


def test_tile_overhead_from_idle_cores_and_rereads() -> None:
    b = GraphBuilder("sm")
    x = b.add_input(TensorType(DType.float32, (3, 16000)), "x")
    m = b.add("amax", (x,), {"dims": (-1,), "keepdim": True})
    out = b.add("exp", (b.add("sub", (x, m)),))
    g = b.build([out])
    k = lower_group("k", list(g.nodes), [x], [out], g.value_types(), supports)
    four = dataclasses.replace(CPU, cores=4)
    t = terms.kernel_terms(k, choose_tile(k, four), four)
    assert t.efficiency == pytest.approx(3 / 4)  # three rows on four cores
    assert t.tile > 0 and t.reread == 0
    small = dataclasses.replace(four, on_chip_bytes=16384)  # the row (64 kB) no longer fits
    tile = choose_tile(k, small)
    assert not tile.persistent
    t2 = terms.kernel_terms(k, tile, small)
    assert t2.reread == pytest.approx(terms.reread_bytes(k, tile) / small.memory_bandwidth) and t2.reread > 0
    one_core = terms.kernel_terms(_chain("c", DType.float32, 64, ("add",)), choose_tile(k, four), four)
    assert one_core.efficiency == pytest.approx(1 / 4)  # under PARALLEL_MIN: the calling thread alone


def test_bandwidth_by_cache_level() -> None:
    p = dataclasses.replace(
        CPU, cache_bandwidth={"l2": 4e11, "l3": 2e11}, l2_bytes=1 << 20, l3_bytes=32 << 20
    )
    assert terms.bandwidth(1 << 20, p) == ("l2", 4e11)  # 1 MiB over 4 cores' L2
    assert terms.bandwidth(16 << 20, p) == ("l3", 2e11)
    assert terms.bandwidth(1 << 30, p) == ("memory", p.memory_bandwidth)
    assert terms.bandwidth(1 << 10, CPU)[0] == "memory"  # uncalibrated: memory bandwidth everywhere
    assert math.isfinite(terms.spill_seconds_per_value(p))


def test_row_invariant_statements_count_once_per_row() -> None:
    """log_softmax in one kernel: log(sum) sits in the last stage's body but reads only an earlier
    stage's accumulator, so it runs per row (the compiler hoists it), not per element."""
    b = GraphBuilder("ls")
    x = b.add_input(TensorType(DType.float32, (16, 300)), "x")
    s = b.add("sub", (x, b.add("amax", (x,), {"dims": (-1,), "keepdim": True})))
    lse = b.add("log", (b.add("sum", (b.add("exp", (s,)),), {"dims": (-1,), "keepdim": True}),))
    out = b.add("sub", (s, lse))
    g = b.build([out])
    k = lower_group("k", list(g.nodes), [x], [out], g.value_types(), supports)
    assert any(st.op == "log" for stage in k.stages for st in stage)  # in a stage body, not in `post`
    per_element_log = 16 * 300 * terms.DEFAULT_OP_WEIGHTS["transcendental"]
    assert terms.weighted_flops(k, CPU) < per_element_log
