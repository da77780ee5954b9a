"""`autofusion.super_kernel_scope`: marks survive capture, group SuperKernels, options parse."""

from __future__ import annotations

import pytest
import torch

import autofusion
from autofusion.errors import FusionError, InputMismatchError
from autofusion.ir.scope import NO_FUSE, SuperKernelOptions, format_options, parse_options


class Scoped(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with autofusion.super_kernel_scope("a"):
            y = torch.softmax(x * 2, -1)
        with autofusion.super_kernel_scope("b", options="early-start=0"):
            z = torch.softmax(y + 1, -1).sin()
            with autofusion.super_kernel_scope(None):
                w = torch.cos(z)
        return w * 3


@pytest.mark.parametrize("capture", ["strict", "non-strict"])
def test_scope_marks_survive_export(capture: str) -> None:
    x = torch.randn(8, 64)
    cm = autofusion.compile(Scoped(), (x,), capture=capture, super_kernel="on")
    scopes = {n.op: n.scope for n in cm.graph.nodes if n.op in ("softmax", "sin", "cos")}
    assert scopes == {"softmax": "b|early-start=0", "sin": "b|early-start=0", "cos": NO_FUSE}
    assert {n.scope for n in cm.graph.nodes if n.op == "mul"} == {"a", ""}
    torch.testing.assert_close(cm(x), Scoped()(x))


def test_scopes_group_super_kernels_and_none_is_never_fused() -> None:
    x = torch.randn(8, 64)
    cm = autofusion.compile(Scoped(), (x,), super_kernel="on")
    sp = cm._last.program.super_plan
    assert [(sk.scope, sk.options.early_start) for sk in sp.super_kernels] == [("a", 1), ("b", 0), ("", 1)]
    # cos (marked None) is not in any kernel: it runs on its own and splits scope b.
    cos_steps = [p for p in sp.program if isinstance(p, int) and sp.plan.steps[p].node.op == "cos"]
    assert len(cos_steps) == 1
    assert [s.code for s in sp.splits] == ["IN_UNFUSIBLE_SCOPE"]
    # Ops of different scopes never share a kernel (NF2009).
    assert any(d.code == "NF2009" for d in sp.plan.decisions)


def test_scope_marks_reach_the_torch_compile_backend() -> None:
    seen = {}

    def spy(gm, example_inputs):
        seen["scopes"] = {str(n.meta.get("custom", {}).get("autofusion_super_kernel_scope")) for n in gm.graph.nodes}
        return autofusion.autofusion_backend(gm, example_inputs, options={"super_kernel": "on"})

    x = torch.randn(8, 64)
    with torch.no_grad():
        got = torch.compile(Scoped(), backend=spy)(x)
    assert {"a", "b", NO_FUSE} <= seen["scopes"]
    torch.testing.assert_close(got, Scoped()(x))


def test_options_parse_the_real_form() -> None:
    o = parse_options("early-start=0:split-mode=8:debug-sync-all=1:preload-code=max")
    assert (o.early_start, o.split_mode, o.debug_sync_all, o.preload_code) == (0, 8, 1, "max")
    assert o.sync_all
    assert parse_options("") == SuperKernelOptions()
    assert parse_options(format_options(o)) == o


def test_unknown_option_warns_and_is_ignored() -> None:
    with pytest.warns(UserWarning, match="unknown option 'fast-math'"):
        o = parse_options("fast-math=1:early-start=2")
    assert o.early_start == 2


def test_option_without_value_warns() -> None:
    with pytest.warns(UserWarning, match="has no '=value'"):
        parse_options("early-start")


@pytest.mark.parametrize("text", ["split-mode=0", "split-mode=65", "early-start=x", "func-align=3", "preload-code=all"])
def test_bad_option_values_raise(text: str) -> None:
    with pytest.raises(InputMismatchError, match=text.split("=")[0]):
        parse_options(text)


def test_scope_names_are_checked() -> None:
    with pytest.raises(InputMismatchError), autofusion.super_kernel_scope("x" * 256):
        pass
    with pytest.raises(InputMismatchError), autofusion.super_kernel_scope(""):
        pass


def test_unknown_option_warns_at_the_with_line() -> None:
    with pytest.warns(UserWarning) as record, autofusion.super_kernel_scope("s", options="nope=1"):
        pass
    assert record[0].filename == __file__


def test_super_kernel_option_is_checked() -> None:
    with pytest.raises(ValueError, match="super_kernel"):
        autofusion.Options(super_kernel="sometimes")


def test_strict_scope_check_raises_where_a_scope_must_split() -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        with autofusion.super_kernel_scope("s", options="strict-scope-check=1"):
            a = torch.softmax(x * 2, -1)
            return torch.tanh(torch.cumsum(a, -1)) + a  # cumsum runs through torch: the scope splits

    x = torch.randn(4, 9)
    with pytest.raises(FusionError, match=r"strict-scope-check=1 but must split at .*OP_UNSUPPORT"):
        autofusion.compile(model, (x,), super_kernel="on")
