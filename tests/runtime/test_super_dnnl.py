"""oneDNN convolutions as SuperKernel members (plan/entry_conv.py, runtime/super_dnnl.py): conv chains
with bias, BN, activations and residuals, depthwise and grouped, odd sizes and batches equal eager; the
entry really ran its "dnnl_conv" members (the executor's count, the route counter, the plan); a
parameter changed in place or re-assigned between calls is seen; without the glue the
convolutions run as today outside the entries, the reason logged and given for each of them."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autofusion
from autofusion import compiler
from autofusion.codegen.cpp import dnnl_conv
from autofusion.errors import ExecutionError
from autofusion.plan.entry_conv import is_conv_call
from autofusion.plan.entry_ops import entry_ops
from autofusion.plan.schedule import OpStep
from autofusion.runtime import dnnl_route, library
from autofusion.runtime.super_executor import SuperExecutor

MISSING = "oneDNN (onednn-cpu-gomp, onednn-devel-cpu-gomp) is not installed"
pytestmark = pytest.mark.skipif(isinstance(dnnl_conv.find_install(), str), reason=MISSING)


def _executor(cm) -> SuperExecutor:
    ex = cm.last.program.executor
    ex = getattr(ex, "inner", ex)  # a FoldedExecutor around it (freezing)
    assert isinstance(ex, SuperExecutor), type(ex)
    return ex


def _inside(cm) -> int:
    sp = cm.last.program.super_plan
    return 0 if sp is None else sum(1 for k in sp.callable_ops.values() if k == "dnnl_conv")


def _bn(c: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    return bn


class Chain(nn.Module):
    """An NCHW stem, then a channels-last chain: BN + relu, depthwise + relu6, grouped + silu, a 1x1 with
    a residual add + relu, a strided conv with bias and no activation, a pointwise kernel, and a last
    conv handing NCHW back."""

    def __init__(self, c: int = 12, groups: int = 3) -> None:
        super().__init__()
        self.stem, self.b0 = nn.Conv2d(3, c, 3, padding=1, bias=False), _bn(c)
        self.dw, self.b1 = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), _bn(c)
        self.gr, self.b2 = nn.Conv2d(c, c, 3, padding=1, groups=groups, bias=False), _bn(c)
        self.pw, self.b3 = nn.Conv2d(c, c, 1, bias=False), _bn(c)
        self.down = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.head = nn.Conv2d(2 * c, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b0(self.stem(x)))
        z = F.relu6(self.b1(self.dw(y)))
        z = F.silu(self.b2(self.gr(z)))
        z = torch.relu(self.b3(self.pw(z)) + y)
        z = self.down(z)
        return self.head(torch.sigmoid(z) * z)


def _compile(m: nn.Module, x: torch.Tensor, **kw):
    return autofusion.compile(m, (x,), conv_layout="dnnl", super_kernel="on", **kw)


@pytest.mark.parametrize(
    ("batch", "c", "groups", "h", "w"),
    [(1, 12, 3, 13, 11), (3, 12, 4, 7, 9), (2, 18, 6, 5, 17)],
    ids=["b1-13x11", "b3-7x9", "b2-c18-5x17"],
)
def test_a_conv_chain_in_entries_equals_eager(batch: int, c: int, groups: int, h: int, w: int) -> None:
    torch.manual_seed(0)
    m = Chain(c, groups).eval()
    x = torch.randn(batch, 3, h, w)
    with torch.no_grad():
        cm = _compile(m, x)
        ref = m(x)
        before = library.ROUTE_CALLS["dnnl"]
        ex = _executor(cm)
        runs = ex.entry_convs
        out = cm(x)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        inside = _inside(cm)
        # The stem reads the NCHW input and the head hands NCHW back: the four between run in entries.
        assert inside >= 4, cm.last.program.super_plan.callable_ops
        assert ex.entry_convs - runs == inside
        assert library.ROUTE_CALLS["dnnl"] - before == 6  # all six convolutions ran the dnnl route
        # Later calls reuse the handles and still agree (new input values, same buffers).
        x2 = torch.randn_like(x)
        torch.testing.assert_close(cm(x2), m(x2), rtol=1e-4, atol=1e-4)
        assert ex.dnnl.made == inside  # one primitive per member, made once


def test_non_contiguous_input_and_poisoned_buffers() -> None:
    torch.manual_seed(1)
    m = Chain().eval()
    x = torch.randn(2, 3, 18, 22)[:, :, ::2, 1::2]  # strided view
    with torch.no_grad():
        cm = _compile(m, x, poison=True)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        assert _executor(cm).entry_convs >= 4


def test_a_weight_changed_between_calls_is_seen() -> None:
    torch.manual_seed(2)
    m = Chain().eval()
    x = torch.randn(2, 3, 9, 10)
    with torch.no_grad():
        cm = _compile(m, x)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        ex = _executor(cm)
        made = ex.dnnl.made
        m.dw.weight.mul_(-1.5)  # in place: a new version of a member's weight
        m.b3.running_var.add_(1.0)  # a BN statistic folded into another member
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        assert ex.dnnl.made > made
        m.gr.weight.data = torch.randn_like(m.gr.weight)  # new storage behind the same parameter
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        made = ex.dnnl.made
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        assert ex.dnnl.made == made  # unchanged parameters: no new primitive
        assert ex.entry_convs >= 4 * 4


def test_without_freezing_the_parameters_are_read_live() -> None:
    torch.manual_seed(3)
    m = Chain().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        cm = _compile(m, x, freeze=False)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
        assert _executor(cm).entry_convs >= 4
        m.pw.weight.mul_(0.25)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


def test_bfloat16_chain_in_entries() -> None:
    torch.manual_seed(4)
    m = Chain().eval().to(torch.bfloat16)
    x = torch.randn(2, 3, 11, 9).to(torch.bfloat16)
    with torch.no_grad():
        cm = _compile(m, x)
        ref = Chain().eval()
        ref.load_state_dict({k: v.float() for k, v in m.state_dict().items()})
        torch.testing.assert_close(cm(x).float(), ref(x.float()), rtol=5e-2, atol=8e-2)
        assert _executor(cm).entry_convs >= 4


def test_without_the_glue_the_convolutions_run_outside_with_a_reason(tmp_path, monkeypatch, caplog) -> None:
    torch.manual_seed(5)
    m = Chain().eval()
    x = torch.randn(2, 3, 9, 9)
    monkeypatch.setattr(dnnl_route, "GLUE_PREFIX", str(tmp_path))  # no oneDNN there
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="autofusion.codegen"):
        cm = _compile(m, x)
        before = dict(library.ROUTE_CALLS)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
    assert _inside(cm) == 0
    assert library.ROUTE_CALLS["dnnl"] == before.get("dnnl", 0)  # the route fell back, as today
    assert library.ROUTE_CALLS["onednn"] - before.get("onednn", 0) == 6
    said = [r.getMessage() for r in caplog.records if "route unavailable" in r.getMessage()]
    assert len(said) == 1 and "libdnnl" in said[0], said
    # What the planner says for each routed convolution (the split log, where one splits a scope).
    plan = cm.last.program.plan
    why = entry_ops(plan, True, "", None, compiler._dnnl_status(plan)).why_not
    convs = [i for i, s in enumerate(plan.steps) if isinstance(s, OpStep) and is_conv_call(s.node)]
    assert len(convs) == 6
    reasons = [why[i] for i in convs]
    assert sum("oneDNN glue is unavailable" in r and "libdnnl" in r for r in reasons) >= 4, reasons


def test_a_failing_member_raises_its_reason() -> None:
    torch.manual_seed(6)
    m = Chain().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        cm = _compile(m, x)
        cm(x)
        ex = _executor(cm)
        ex.dnnl.err.value = b"oneDNN said no"  # what af_dnnl_conv_execute writes when it fails
        with pytest.raises(ExecutionError, match="oneDNN said no"):
            cm(x)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)  # cleared: the next call runs


def test_a_zoo_cnn_runs_its_convolutions_in_entries() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo

    m, xs = zoo.build("mobilenet_v2", batch=2, tiny=True)
    with torch.no_grad():
        cm = autofusion.compile(m, list(xs), conv_layout="dnnl")
        ref = m(*xs)
        out = cm(*xs)
    out_t = out if isinstance(out, torch.Tensor) else out[0]
    ref_t = ref if isinstance(ref, torch.Tensor) else ref[0]
    torch.testing.assert_close(out_t, ref_t, rtol=1e-3, atol=1e-3)
    n_conv = sum(isinstance(mod, nn.Conv2d) for mod in m.modules())
    assert cm.stats["super_kernel"]["on"], cm.stats["super_kernel"]
    assert _inside(cm) >= n_conv - 2, cm.stats["super_kernel"]
    assert _executor(cm).entry_convs == _inside(cm)


def test_entry_conv_results_live_in_the_arena() -> None:
    """The results oneDNN writes inside an entry are arena values, the last one read by the NCHW head
    conv outside the entry too (a conv_bn_act result is never a view of its input): no fresh tensor per
    call (a fresh one page-faults and is cold). Outputs of one call survive the next call and share no
    storage with the arena; poisoned buffers would show an unwritten element."""
    torch.manual_seed(2)
    m = Chain().eval()
    x, x2 = torch.randn(2, 3, 9, 11), torch.randn(2, 3, 9, 11)
    with torch.no_grad():
        cm = _compile(m, x, poison=True)
        sp = cm.last.program.super_plan
        outputs = set(sp.plan.graph.outputs)
        results = [
            sp.plan.steps[i].node.outputs[0].id for i, k in sp.callable_ops.items() if k == "dnnl_conv"
        ]
        assert len(results) >= 4, sp.callable_ops
        assert all(v in sp.arena_values and v not in outputs for v in results), (results, sp.arena_values)
        ex = _executor(cm)
        assert all(not call.fresh for kind, call, _ in ex._program if kind == "super")
        first = cm(x)
        ref = m(x)
        second = cm(x2)
        for a, b in zip(
            torch.utils._pytree.tree_leaves(first), torch.utils._pytree.tree_leaves(ref), strict=True
        ):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # not overwritten by the second call
            assert a.untyped_storage().data_ptr() != ex.arena.untyped_storage().data_ptr()
        for a, b in zip(
            torch.utils._pytree.tree_leaves(second), torch.utils._pytree.tree_leaves(m(x2)), strict=True
        ):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert ex.entry_convs >= 2 * len(results)
