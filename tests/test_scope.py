"""`autofusion.super_kernel_scope`: marks survive capture, group SuperKernels, options parse."""

from __future__ import annotations

import pytest
import torch

import autofusion
from autofusion.errors import FusionError, InputMismatchError
from autofusion.ir.graph import Node
from autofusion.ir.scope import (
    NO_FUSE,
    NO_SCOPE,
    OPTIONS_KEY,
    SCOPE_KEY,
    Scope,
    SuperKernelOptions,
    format_options,
    parse_options,
)  # fmt: skip


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
    b = Scope("b", SuperKernelOptions(early_start=0))
    assert scopes == {"softmax": b, "sin": b, "cos": Scope(NO_FUSE)}
    assert str(scopes["sin"]) == "b|early-start=0" and scopes["cos"].no_fuse and not b.no_fuse
    assert {n.scope for n in cm.graph.nodes if n.op == "mul"} == {Scope("a"), NO_SCOPE}
    torch.testing.assert_close(cm(x), Scoped()(x))


def test_scopes_group_super_kernels_and_none_is_never_fused() -> None:
    x = torch.randn(8, 64)
    cm = autofusion.compile(Scoped(), (x,), super_kernel="on")
    sp = cm.last.program.super_plan
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
        seen["scopes"] = {
            str(n.meta.get("custom", {}).get("autofusion_super_kernel_scope")) for n in gm.graph.nodes
        }
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


@pytest.mark.parametrize(
    "text", ["split-mode=0", "split-mode=65", "early-start=x", "func-align=3", "preload-code=all"]
)
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


class ScopedConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with autofusion.super_kernel_scope("a"):
            return torch.sin(torch.relu(self.bn(self.conv(x)))) * 2


def test_scope_marks_survive_the_rule_pass() -> None:
    model, x = ScopedConvBn().eval(), torch.randn(1, 4, 8, 8)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,), enabled_rules=frozenset({"conv_bn_relu"}))
        torch.testing.assert_close(cm(x), model(x), rtol=1e-4, atol=1e-4)
    assert cm.stats["rules"] == {"conv_bn_relu": 1}
    # The library call and the nodes copied around it keep scope "a".
    assert {n.scope.name for n in cm._last.program.plan.graph.nodes} == {"a"}


def test_scope_is_parsed_once_from_the_fx_meta() -> None:
    assert Scope.from_meta({}) is NO_SCOPE and Scope.from_meta({"custom": {}}) is NO_SCOPE
    meta = {"custom": {SCOPE_KEY: "outer/inner", OPTIONS_KEY: "early-start=0:strict-scope-check=1"}}
    scope = Scope.from_meta(meta)
    assert scope == Scope("outer/inner", SuperKernelOptions(early_start=0, strict_scope_check=1))
    assert Scope.from_meta(meta) is scope  # one parse per scope, not per node
    assert str(scope) == "outer/inner|early-start=0:strict-scope-check=1" and str(NO_SCOPE) == ""
    assert Scope.from_meta({"custom": {SCOPE_KEY: NO_FUSE, OPTIONS_KEY: ""}}).no_fuse
    # Nodes carry the typed value; the default is no scope.
    assert Node("add", (), ()).scope is NO_SCOPE


def test_strict_capture_of_scopes_does_not_warn_about_the_scope_stack() -> None:
    """Dynamo reports the scope stack's appends and pops as side effects; capture filters exactly
    that warning, whatever module the stack lives in."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        autofusion.compile(Scoped(), (torch.randn(8, 64),), capture="strict", super_kernel="on")
    assert not [w for w in seen if "side effects" in str(w.message)]
