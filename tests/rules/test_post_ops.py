"""The post-op activations of the rules' library calls have one list (ir/targets.py): what the rules
match (passes/rewrite/post_ops.py) is what the runtime runs (runtime/library.py), on every route."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from autofusion.ir import DType, GraphBuilder, TensorType
from autofusion.ir.targets import CONV_POST_OPS, POST_OPS_ONEDNN, RESIDUAL_POST_OPS
from autofusion.passes.rewrite.post_ops import activation
from autofusion.runtime import library

NODES: list[tuple[str, dict[str, Any], str | None]] = [
    ("relu", {}, "relu"),
    ("silu", {}, "silu"),
    ("gelu", {"approximate": "none"}, "gelu"),
    ("gelu", {"approximate": "tanh"}, "gelu_tanh"),
    ("clamp", {"min": 0.0, "max": 6.0}, "relu6"),
    ("clamp", {"min": 0, "max": 6}, "relu6"),
    ("clamp", {"min": 0.0, "max": 5.0}, None),  # not ReLU6: no oneDNN post-op
    ("sigmoid", {}, None),
]
REFERENCE = {"none": lambda t: t, "relu": F.relu, "relu6": F.relu6, "silu": F.silu}


@pytest.mark.parametrize(("op", "attrs", "name"), NODES)
def test_the_rules_name_only_post_ops_the_runtime_knows(
    op: str, attrs: dict[str, Any], name: str | None
) -> None:
    b = GraphBuilder("act")
    x = b.add_input(TensorType(DType.float32, (4,)), "x")
    (node,) = b.build([b.add(op, [x], attrs)]).nodes
    assert activation(node) == name
    assert activation(None) == "none"
    assert name is None or name in POST_OPS_ONEDNN


def test_the_conv_post_ops_are_runtime_post_ops() -> None:
    assert set(CONV_POST_OPS) <= set(POST_OPS_ONEDNN) and set(RESIDUAL_POST_OPS) <= set(CONV_POST_OPS)
    assert library._ACT_ONEDNN is POST_OPS_ONEDNN


@pytest.mark.parametrize("act", CONV_POST_OPS)
@pytest.mark.parametrize("route", library.ROUTES)
def test_every_conv_post_op_runs_on_every_route(act: str, route: str) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 7, 6, generator=gen) * 4
    w, b = torch.randn(6, 5, 3, 3, generator=gen), torch.randn(6, generator=gen)
    ref = REFERENCE[act](F.conv2d(x, w, b, padding=1))
    before = dict(library.ROUTE_CALLS)
    with torch.no_grad():
        y = library.conv_bn_act(x, w, b, None, None, None, None, None, 1e-5, [1, 1], [1, 1], [1, 1], 1, act,
                                route, False)  # fmt: skip
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    ran = {k for k, v in library.ROUTE_CALLS.items() if v != before.get(k, 0)}
    expected = route if route != "onednn" or library.onednn_ok(x) else "aten_cl"
    assert ran == {expected}, ran
