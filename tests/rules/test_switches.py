"""Switches change the plan: GF_AUTOFUSION_*, AUTOFUSE_FLAGS, fusion_config JSON, blacklist, skip list."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import autofusion
from autofusion.config import Options
from autofusion.config.flags import FUSION_KINDS
from autofusion.passes.manager import PASS_NAMES
from autofusion.passes.rewrite import RuleFileError, settle_options


def _resnet(**options):
    model, inputs = autofusion.builtin("resnet-block")
    with torch.no_grad():
        cm = autofusion.compile(model, inputs, **options)
        torch.testing.assert_close(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    return cm


def _plan(fn, inputs, options: Options):
    # cache_dir stays the environment default (an Options() made in a test has none)
    cm = autofusion.compile(
        fn, inputs, **{k: getattr(options, k) for k in Options.names() if k != "cache_dir"}
    )
    with torch.no_grad():
        torch.testing.assert_close(cm(*inputs), fn(*inputs), rtol=1e-5, atol=1e-5)
    return cm.stats


def _softmax_chain(x: torch.Tensor) -> torch.Tensor:
    return (torch.softmax(x, -1) * 2.0).relu()


def test_debug_turns_all_fusion_off() -> None:
    opts = Options.from_env({"GF_AUTOFUSION_DEBUG": "1"})
    assert opts.fusion is False
    stats = _plan(_softmax_chain, (torch.randn(8, 40),), opts)
    assert stats["fused_kernels"] == 0 and stats["kernels"] == stats["ops"]
    assert Options.from_env({"GF_AUTOFUSION_DEBUG": "0"}).fusion is True


def test_disable_names_rules_and_passes(caplog) -> None:
    opts = Options.from_env({"GF_AUTOFUSION_DISABLE": "conv_bn_relu, horizontal_pattern,cse"})
    assert opts.disabled == frozenset({"conv_bn_relu", "horizontal_pattern", "cse"})
    assert not opts.enabled("cse") and opts.enabled("conv_bn")
    on, off = _resnet(), _resnet(disabled=opts.disabled)
    assert on.stats["rules"] == {"conv_bn_relu": 1, "conv_bn_add_relu": 1}
    assert off.stats["rules"] == {
        "conv_bn": 1,
        "conv_bn_add_relu": 1,
    }  # conv1+bn1 still folds; relu is a kernel
    assert off.stats["kernels"] > on.stats["kernels"]
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        settle_options(Options.from_env({"GF_AUTOFUSION_DISABLE": "conv_bn_rleu"}))
    assert "did you mean 'conv_bn_relu'" in caplog.text


def test_every_pass_name_is_a_known_switch(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        settle_options(Options.from_env({"GF_AUTOFUSION_DISABLE": ",".join(PASS_NAMES)}))
    assert caplog.text == ""


def test_fusion_config_json(tmp_path: Path, caplog) -> None:
    path = tmp_path / "fusion.json"
    path.write_text(
        json.dumps(
            {
                "fusion_config": {
                    "conv_bn_relu": "off",
                    "conv_bn": "off",
                    "conv_bn_add_relu": "off",
                    "conv_bn_add": "on",  # built-in rules ship off; this file replaces the test-wide config
                    "horizontal_pattern": "on",
                    "layout_transpose_eliminate": "on",
                }
            }
        )
    )
    opts = settle_options(Options.from_env({"AUTOFUSION_FUSION_CONFIG": str(path)}))
    assert {
        "conv_bn_relu",
        "conv_bn",
        "conv_bn_add_relu",
    } <= opts.disabled and "horizontal_pattern" not in opts.disabled
    cm = _resnet(fusion_config=str(path))
    assert cm.stats["rules"] == {"conv_bn_add": 1}  # the next rule in order takes conv2 + bn2 + add
    assert cm.stats["kernels"] > _resnet().stats["kernels"]
    path.write_text('{"fusion_config": {\n  "conv_bn_relu": "off",\n  "horizontal_patern": "on"\n}}')
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        settle_options(Options(fusion_config=str(path)))
    assert "did you mean 'horizontal_pattern'" in caplog.text
    path.write_text('{"fusion_config": {\n  "conv_bn_relu": "maybe"\n}}')
    with pytest.raises(RuleFileError, match=rf"{path}:2: switch 'conv_bn_relu' must be"):
        settle_options(Options(fusion_config=str(path)))
    path.write_text('{"fusion_config": {\n  "conv_bn_relu": off\n}}')
    with pytest.raises(RuleFileError, match=rf"{path}:2: JSON syntax error"):
        settle_options(Options(fusion_config=str(path)))


def test_autofuse_flags_parsing(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        opts = Options.from_env(
            {
                "AUTOFUSE_FLAGS": "--enable_autofuse=true;--max_fusion_size=3;"
                "--recomputation_threshold=2;junk;--a=b=c;--max_fusion_size=lots"
            }
        )
    assert opts.fusion and opts.max_fusion_size == 3 and opts.recomputation_threshold == 2
    assert "--max_fusion_size='lots'" in caplog.text  # invalid value: warned, earlier/default value kept
    assert "'junk' is not a --key=value item" in caplog.text and "'--a=b=c' is not" in caplog.text
    assert Options.from_env({"AUTOFUSE_FLAGS": "--enable_autofuse=false"}).fusion is False
    assert Options.from_env({"AUTOFUSE_FLAGS": "--max_fusion_size=0"}).fusion is False  # CANN: 0 = no fusion
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        bad = Options.from_env({"AUTOFUSE_FLAGS": "--recomputation_threshold=300;--enable_autofuse=maybe"})
    assert bad.recomputation_threshold == 1 and bad.fusion is True
    assert "0..255" in caplog.text and "true/false" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        opts = Options.from_env(
            {"AUTOFUSE_FLAGS": "--autofuse_enable_pass=reduce,concat;--autofuse_disable_pass=concat,conv"}
        )
    assert opts.fusion_kinds == frozenset({"reduce"})  # concat in both lists: disabled, with a warning
    assert "concat given to both" in caplog.text
    assert Options.from_env({}).fusion_kinds == frozenset(FUSION_KINDS)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        keep = Options.from_env({"AUTOFUSE_FLAGS": "--autofuse_disable_pass=reduse"})
    assert keep.fusion_kinds == frozenset(FUSION_KINDS) and "did you mean 'reduce'" in caplog.text


def test_autofuse_flags_change_the_plan() -> None:
    x = (torch.randn(8, 40),)
    base = _plan(_softmax_chain, x, Options.from_env({}))
    no_reduce = _plan(
        _softmax_chain, x, Options.from_env({"AUTOFUSE_FLAGS": "--autofuse_disable_pass=reduce"})
    )
    small = _plan(_softmax_chain, x, Options.from_env({"AUTOFUSE_FLAGS": "--max_fusion_size=2"}))
    assert base["kernels"] == 1
    assert no_reduce["kernels"] > base["kernels"] and small["kernels"] > base["kernels"]
    conv_off = _resnet(
        fusion_kinds=Options.from_env({"AUTOFUSE_FLAGS": "--autofuse_disable_pass=conv"}).fusion_kinds
    )
    assert not conv_off.stats["rules"]
    only_reduce = Options.from_env({"AUTOFUSE_FLAGS": "--autofuse_enable_pass=reduce"}).fusion_kinds
    model, inputs = autofusion.builtin("transformer-block")
    with torch.no_grad():
        cm = autofusion.compile(model, inputs, fusion_kinds=only_reduce)
        torch.testing.assert_close(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    assert not cm.stats["rules"]  # matmul is off: no attention or linear rules


def _ew(x: torch.Tensor) -> torch.Tensor:
    return (x * 2.0).relu().sigmoid() + x


def test_blacklist(tmp_path: Path) -> None:
    x = (torch.randn(16, 30),)
    bl = tmp_path / "blacklist.txt"
    bl.write_text("# never fuse these\nRelu\n\naten.sigmoid.default  # any spelling\n")
    base = _plan(_ew, x, Options())
    listed = _plan(_ew, x, Options.from_env({"AUTOFUSION_BLACKLIST": str(bl)}))
    assert base["kernels"] == 1 and listed["kernels"] >= 3
    bl.write_text("Relu\nSigmod\n")
    with pytest.raises(RuleFileError, match=rf"{bl}:2: unknown op type 'Sigmod'.*sigmoid"):
        settle_options(Options(blacklist=(str(bl),)))


def test_blacklisted_composite_excludes_what_it_decomposes_into(tmp_path: Path) -> None:
    bl = tmp_path / "blacklist.txt"
    bl.write_text("Softmax\n")
    x = (torch.randn(8, 40),)
    stats = _plan(_softmax_chain, x, Options(blacklist=(str(bl),)))
    assert stats["kernels"] == 2 and stats["fused_kernels"] == 1  # torch.softmax, then mul+relu fused
    cm = autofusion.compile(_softmax_chain, x, blacklist=(str(bl),))
    assert [s.node.op for s in cm.last.program.plan.steps if hasattr(s, "node")] == ["softmax"]


def test_skip_node_names_cfg(tmp_path: Path) -> None:
    x = (torch.randn(16, 30),)
    ini = tmp_path / "skip.ini"
    ini.write_text("[ByNodeName]\nrelu\n\n[ByNodeType]\nSigmoid\n")
    opts = Options.from_env({"AUTOFUSE_DFX_FLAGS": f"--skip_node_names_cfg={ini}"})
    assert opts.skip_node_names_cfg == str(ini)
    stats = _plan(_ew, x, opts)
    assert stats["kernels"] >= 3
    ini.write_text("[ByNodeName]\nrelu\n[ByOpType]\nSigmoid\n")
    with pytest.raises(RuleFileError, match=rf"{ini}:3: unknown section \[ByOpType\]"):
        settle_options(Options(skip_node_names_cfg=str(ini)))
    ini.write_text("[ByNodeType]\nSigmoidd\n")
    with pytest.raises(RuleFileError, match=rf"{ini}:2: unknown op type"):
        settle_options(Options(skip_node_names_cfg=str(ini)))


def test_skip_list_keeps_a_rule_from_matching(tmp_path: Path) -> None:
    ini = tmp_path / "skip.ini"
    ini.write_text("[ByNodeType]\nBatchNorm\n")
    cm = _resnet(skip_node_names_cfg=str(ini))
    assert not cm.stats["rules"]


def test_recomputation_threshold_flag_changes_the_plan() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * 2 + 1  # read by two kernels over different reduction spaces
        return torch.softmax(h, -1), torch.softmax(h.t().contiguous(), -1)

    x = (torch.randn(12, 20),)
    opts = Options.from_env({"AUTOFUSE_FLAGS": "--recomputation_threshold=3"})
    assert opts.recomputation_threshold == 3
    cm = autofusion.compile(fn, x, recomputation_threshold=opts.recomputation_threshold)
    base = autofusion.compile(fn, x)
    with torch.no_grad():
        for got, ref in zip(cm(*x), fn(*x), strict=True):
            torch.testing.assert_close(got, ref)
    assert cm.stats["bytes_after"] < base.stats["bytes_after"]


def test_enable_autofuse_false_runs_every_op_on_its_own() -> None:
    opts = Options.from_env({"AUTOFUSE_FLAGS": "--enable_autofuse=false"})
    stats = _plan(_softmax_chain, (torch.randn(8, 40),), opts)
    assert stats["fused_kernels"] == 0


def test_fusion_config_on_switches_on_a_default_off_rule(tmp_path: Path) -> None:
    path = tmp_path / "fusion.json"
    path.write_text(json.dumps({"fusion_config": {"linear_gelu": "on"}}))
    model, inputs = autofusion.builtin("transformer-block")
    with torch.no_grad():
        default = autofusion.compile(model, inputs)
        on = autofusion.compile(model, inputs, fusion_config=str(path))
        torch.testing.assert_close(on(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    assert "linear_gelu" not in default.stats["rules"]
    assert on.stats["rules"]["linear_gelu"] == 1 and "gelu_linear_residual" not in on.stats["rules"]
    assert settle_options(
        Options.from_env({"AUTOFUSION_FUSION_CONFIG": str(path)})
    ).enabled_rules == frozenset({"linear_gelu"})


def test_settling_again_reads_nothing_and_warns_once(tmp_path: Path, caplog) -> None:
    """A compile settles its options more than once (the model, then each signature's plan): the
    unknown-name warning appears once, and a changed fusion_config file is read again."""
    path = tmp_path / "fusion.json"
    path.write_text('{"fusion_config": {"conv_bn_relu": "off"}}')
    opts = Options(disabled=frozenset({"no_such_rule"}), fusion_config=str(path))
    with caplog.at_level(logging.WARNING, logger="autofusion.config"):
        first = settle_options(opts)
        assert settle_options(opts) is first and settle_options(first) is first
    assert caplog.text.count("'no_such_rule' is not a rule or pass name") == 1
    assert "conv_bn_relu" in first.disabled
    path.write_text('{"fusion_config": {"conv_bn": "off", "conv_bn_relu": "on"}}')
    again = settle_options(opts)
    assert "conv_bn" in again.disabled and "conv_bn_relu" in again.enabled_rules
