"""Rule files: the seed format, op-name spellings, conditions, and bad files (file:line, what is wrong)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

import autofusion
from autofusion.config import Options
from autofusion.ir.dtypes import DType
from autofusion.ir.types import TensorType
from autofusion.passes.rewrite import RuleFileError, all_rules, settle_options
from autofusion.passes.rewrite.expr import ExprError, evaluate, parse
from autofusion.passes.rewrite.library import KNOWN
from autofusion.passes.rewrite.loader import parse_rules
from autofusion.passes.rewrite.opnames import UnknownOpName, resolve
from autofusion.tools.cli.main import main


def _write(tmp_path: Path, text: str, name: str = "rules.yaml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(p)


SEED_RULES = """
fusion_rules:
  - name: "elementwise_add_relu"
    pattern:
      - op_type: "Add"
      - op_type: "Relu"
    constraint:
      input_dtype: ["float16", "float32"]
      max_tile_size: 65536
    priority: 10
  - name: "custom_mul_sigmoid_fusion"
    pattern:
      - op_type: "Mul"
      - op_type: "Sigmoid"
    constraint:
      input_dtype: ["float16"]
      max_tile_size: 32768
      require_contiguous: true
    priority: 15
"""


def test_seed_examples_load() -> None:
    rules = parse_rules(SEED_RULES, "classify_rule.yaml", KNOWN)
    assert [r.name for r in rules] == ["elementwise_add_relu", "custom_mul_sigmoid_fusion"]
    add_relu = rules[0]
    assert [n.ops for n in add_relu.nodes] == [frozenset({"add"}), frozenset({"relu"})]
    assert add_relu.constraint.input_dtype == frozenset({DType.float16, DType.float32})
    assert add_relu.constraint.max_tile_size == 65536 and add_relu.becomes == "kernel"
    assert rules[1].constraint.require_contiguous and rules[1].priority == 15
    assert add_relu.source == "classify_rule.yaml:3"  # the text starts with a newline


@pytest.mark.parametrize(
    "name,ops",
    [
        ("Relu", {"relu"}),
        ("aten.relu.default", {"relu"}),
        ("relu", {"relu"}),
        ("LayerNorm", {"layer_norm"}),
        ("MatMul", {"mm", "bmm"}),
        ("Softmax", {"softmax"}),
        ("Sigmoid", {"sigmoid"}),
        ("Mul", {"mul"}),
        ("aten.add.Tensor", {"add"}),
        ("BatchNormalization", {"batch_norm"}),
        ("Conv2D", {"conv"}),
        ("Gemm", {"addmm", "linear"}),
    ],
)
def test_op_name_spellings(name: str, ops: set[str]) -> None:
    assert resolve(name) == frozenset(ops)
    assert resolve("Dropout") is None  # identity in eval


def test_unknown_op_lists_closest_names() -> None:
    with pytest.raises(UnknownOpName) as e:
        resolve("Sigmod")
    assert "sigmoid" in e.value.suggestions


def test_condition_language() -> None:
    t = TensorType(DType.float32, (2, 16, 384))
    r = TensorType(DType.float32, (2, 16, 128))
    env = {"qkv": t, "x": r}
    assert evaluate(parse("qkv.shape[-1] == 3 * x.shape[-1] and qkv.rank == x.rank"), env)
    assert evaluate(parse('x.dtype == "float32" and not x.contiguous == false'), env)
    assert evaluate(parse("1 < x.rank <= 3 and x.numel % 128 == 0 and len(x.shape) == 3"), env)
    assert not evaluate(parse("x.shape == qkv.shape or x.shape[0] != 2"), env)
    for bad in ("x.shape ==", "x.size", "__import__('os')", "x.shape[0] === 1", "x; y"):
        with pytest.raises(ExprError):
            parse(bad)


HEAD = "fusion_rules:\n  - name: a\n    pattern: [{op_type: Add}]\n"
BAD_FILES = [
    # (file text, line, words the message must contain)
    ("fusion_rules:\n  - name: a\n    pattern: [ {op_type: Add}\n  - name: b\n", 4, ["YAML syntax error"]),
    (
        "fusion_rules:\n  - name: a\n    pattern:\n      - op_type: Reluu\n",
        4,
        ["unknown op type 'Reluu'", "relu"],
    ),
    (
        "fusion_rules:\n  - name: a\n    nodes:\n      - {op: Add, inputs: [x, y], output: s}\n"
        '      - {op: Relu, inputs: [s], output: out}\n    conditions:\n      - "s.shape == "\n',
        7,
        ["bad condition"],
    ),
    (
        "fusion_rules:\n  - name: a\n    nodes:\n      - {op: Add, inputs: [x, y], output: s}\n"
        '    conditions:\n      - "s.shape == z.shape"\n',
        6,
        ["'z'", "does not bind"],
    ),
    (
        "fusion_rules:\n  - name: a\n    pattern: [{op_type: Add}]\n    constraint:\n      max_tile: 5\n",
        5,
        ["unknown constraint 'max_tile'", "max_tile_size"],
    ),
    (
        HEAD + "    constraint:\n      input_dtype: [float33]\n",
        5,
        ["input_dtype 'float33'", "float32"],
    ),
    (
        HEAD + "    constraint:\n      max_tile_size: -4\n",
        5,
        ["max_tile_size must be a positive integer"],
    ),
    (
        HEAD + "    constraint:\n      require_contiguous: maybe\n",
        5,
        ["require_contiguous must be true or false"],
    ),
    (
        "fusion_rules:\n  - name: a\n    pattern: [{op_type: Add}]\n    becomes: library:sdp\n",
        4,
        ["unknown library implementation 'sdp'", "sdpa"],
    ),
    (
        HEAD + "  - name: a\n    pattern: [{op_type: Mul}]\n",
        4,
        ["defined twice"],
    ),
    (
        "fusion_rules:\n  - name: a\n    patern: [{op_type: Add}]\n",
        3,
        ["unknown rule field 'patern'", "pattern"],
    ),
    (
        "fusion_rules:\n  - name: a\n    pattern: [{op_type: Add}]\n    priority: high\n",
        4,
        ["priority must be an integer"],
    ),
    ("rules:\n  - name: a\n", 1, ["top-level 'fusion_rules:'"]),
    (
        "fusion_rules:\n  - name: a\n    nodes:\n"
        "      - {op: Linear, inputs: [x, w], attrs: {bias: true, groups: 2}}\n",
        4,
        ["no attribute 'groups'"],
    ),
]


@pytest.mark.parametrize("text,line,words", BAD_FILES, ids=[w[0] for _, _, w in BAD_FILES])
def test_bad_file_names_file_line_and_problem(tmp_path: Path, text: str, line: int, words: list[str]) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(RuleFileError) as e:
        settle_options(Options(rules_files=(path,)))
    msg = str(e.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    for w in words:
        assert w in msg, msg


def test_bad_file_is_not_half_applied(tmp_path: Path) -> None:
    good = _write(tmp_path, SEED_RULES, "good.yaml")
    bad = _write(tmp_path, BAD_FILES[1][0], "bad.yaml")
    with pytest.raises(RuleFileError):
        autofusion.compile(lambda x: (x + 1).relu(), (torch.randn(4),), rules_files=(good, bad))
    with pytest.raises(RuleFileError, match="already defined"):
        settle_options(Options(rules_files=(good, good)))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match="cannot read rule file"):
        settle_options(Options(rules_files=(str(tmp_path / "nope.yaml"),)))


def test_builtin_file_ships_with_the_package() -> None:
    import autofusion.passes.rewrite as rules_pkg

    assert (
        Path(rules_pkg.BUILTIN_RULES).is_file()
        and (Path(rules_pkg.__file__).parent / "blacklist.txt").is_file()
    )
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert (
        '"**/*.yaml"' in text and '"**/*.txt"' in text
    )  # package-data ships classify_rule.yaml and blacklist.txt
    assert len(all_rules()) == 22


def _chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y + 1.0).sigmoid() * x


KERNEL_RULE = """
fusion_rules:
  - name: mul_add_sigmoid_mul
    pattern:
      - op_type: Mul
      - op_type: Add
      - op_type: Sigmoid
      - op_type: Mul
    constraint: {input_dtype: [float32], max_tile_size: 100000}
"""


def test_kernel_rule_keeps_its_window_one_kernel(tmp_path: Path) -> None:
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    path = _write(tmp_path, KERNEL_RULE)
    with torch.no_grad():
        small = autofusion.compile(_chain, (x, y), max_fusion_size=2)
        ruled = autofusion.compile(_chain, (x, y), max_fusion_size=2, rules_files=(path,))
        torch.testing.assert_close(ruled(x, y), _chain(x, y))
    assert small.stats["fused_kernels"] >= 2
    assert ruled.stats["rules"] == {"mul_add_sigmoid_mul": 1}
    assert ruled.stats["fused_kernels"] == 1 and ruled.stats["kernels"] == 1
    # A constraint that fails leaves the plan to the solver.
    big = torch.randn(400, 300), torch.randn(400, 300)
    with torch.no_grad():
        cm = autofusion.compile(_chain, big, max_fusion_size=2, rules_files=(path,))
    assert not cm.stats["rules"] and cm.stats["fused_kernels"] >= 2
    # The rule is a switch like any other.
    with torch.no_grad():
        off = autofusion.compile(
            _chain,
            (x, y),
            max_fusion_size=2,
            rules_files=(path,),
            disabled=frozenset({"mul_add_sigmoid_mul"}),
        )
    assert off.stats["fused_kernels"] == small.stats["fused_kernels"]


def test_rules_from_environment_and_cli(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, KERNEL_RULE)
    opts = Options.from_env({"AUTOFUSION_RULES": path})
    assert opts.rules_files == (path,)
    assert main(["rules", "--rules", path]) == 0
    assert "mul_add_sigmoid_mul" in capsys.readouterr().out
    bad = _write(tmp_path, BAD_FILES[1][0], "bad.yaml")
    assert main(["rules", "--rules", bad]) == 2
    assert f"{bad}:4" in capsys.readouterr().err


def test_dag_rule_with_conditions(tmp_path: Path) -> None:
    text = """
    fusion_rules:
      - name: scaled_residual
        nodes:
          - {op: Mul, inputs: [x, s], output: scaled}
          - {op: Add, inputs: [scaled, residual], output: out}
        conditions: ["scaled.shape == residual.shape", "x.shape[-1] == 33"]
        priority: 3
    """
    path = _write(tmp_path, text)

    def f(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return (x * 2.0 + r).exp()

    with torch.no_grad():
        ok = autofusion.compile(f, (torch.randn(4, 33), torch.randn(4, 33)), rules_files=(path,))
        no = autofusion.compile(f, (torch.randn(4, 34), torch.randn(4, 34)), rules_files=(path,))
    assert ok.stats["rules"] == {"scaled_residual": 1}
    assert not no.stats["rules"]


ORDER_RULES = """
fusion_rules:
  - name: add_relu
    pattern: [{op_type: Add}, {op_type: Relu}]
    priority: 5
  - name: mul_add_relu
    pattern: [{op_type: Mul}, {op_type: Add}, {op_type: Relu}]
    priority: 5
  - name: relu_exp
    pattern: [{op_type: Relu}, {op_type: Exp}]
    priority: 5
"""


def _order_graph():
    def f(x: torch.Tensor) -> torch.Tensor:
        return ((x * 2.0 + 1.0).relu()).exp()

    return autofusion.compile(f, (torch.randn(4, 8),), fusion=False).graph


def test_order_longer_first_then_locked_then_priority() -> None:
    from autofusion.passes.rewrite.apply import apply_rules, rule_order

    rules = parse_rules(ORDER_RULES, "order.yaml", KNOWN)
    assert [r.name for r in rule_order(rules)] == ["mul_add_relu", "add_relu", "relu_exp"]
    res = apply_rules(_order_graph(), rules)
    assert res.applied == {"mul_add_relu": 1}  # add_relu and relu_exp overlap its locked window
    assert len(res.groups) == 1 and len(res.groups[0]) == 3
    boosted = parse_rules(
        ORDER_RULES.replace("priority: 5\n  - name: relu_exp", "priority: 5\n  - name: relu_exp").replace(
            "pattern: [{op_type: Relu}, {op_type: Exp}]\n    priority: 5",
            "pattern: [{op_type: Relu}, {op_type: Exp}]\n    priority: 9",
        ),
        "order.yaml",
        KNOWN,
    )
    res = apply_rules(_order_graph(), boosted)
    assert res.applied == {"relu_exp": 1}  # higher priority first; the longer rule now overlaps it
    assert apply_rules(_order_graph(), rules, disabled=frozenset({"mul_add_relu"})).applied == {"add_relu": 1}


def test_rewrite_failure_leaves_the_graph_unchanged(monkeypatch, caplog) -> None:
    import logging

    from autofusion.passes.rewrite import library

    def broken(*args, **kwargs):
        raise RuntimeError("emit exploded")

    monkeypatch.setitem(
        library.LIBRARY, "conv_bn_act", library.Library("conv_bn_act", library._conv_check, broken, "")
    )
    model, inputs = autofusion.builtin("resnet-block")
    with caplog.at_level(logging.WARNING, logger="autofusion.rules"), torch.no_grad():
        cm = autofusion.compile(model, inputs)
        torch.testing.assert_close(cm(*inputs), model(*inputs))
    assert "rewriting failed: emit exploded" in caplog.text
    assert cm.stats["rules"] == {}
