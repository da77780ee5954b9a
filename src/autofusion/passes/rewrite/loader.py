"""Rule files: `fusion_rules:` YAML (CANN's classify_rule format) parsed into checked `Rule`s.

In: YAML text and the file name it came from. Out: a tuple of frozen `Rule`s, or a `RuleFileError`
whose message starts with `file:line:` and says what is wrong; a file either loads whole or not at all.

Two pattern forms:
- `pattern:` an op-type sequence (`- op_type: Add` / `- op_type: Relu`): each step consumes the
  previous step's output. Outputs are named `<op>_out` (and the last one also `out`); the first step's
  inputs are `x0`, `x1`, ...
- `nodes:` a DAG with named inputs, as in CANN's FUSION_PATTERNS: `{op: linear, inputs: [gelu_out, weight,
  bias], output: linear_out}`; `output` defaults to `<op>_out` with '_' removed from the op (`layernorm_out`).
  A name that is some node's output is an edge; any other name binds a tensor from outside the window
  (the same name twice must be the same tensor). `op` may be a list of alternatives.
Other fields: `conditions` (expressions, see expr.py), `constraint` (`input_dtype` whitelist,
`max_tile_size`, `require_contiguous`, `shape`: more expressions), `priority` (higher first; default 0),
`becomes` (`kernel`: one generated kernel, the default; `library:<name>`: an implementation from
`autofusion.passes.rewrite.library`), `enabled` (false: off unless switched on) and `description`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autofusion.errors import RuleFileError
from autofusion.ir.dtypes import DType
from autofusion.ir.ops import get_op
from autofusion.passes.rewrite import expr as E
from autofusion.passes.rewrite.opnames import UnknownOpName, resolve

RULE_KEYS = (
    "name",
    "pattern",
    "nodes",
    "conditions",
    "constraint",
    "priority",
    "becomes",
    "description",
    "enabled",
)
CONSTRAINT_KEYS = ("input_dtype", "max_tile_size", "require_contiguous", "shape")
NODE_KEYS = ("op", "op_type", "inputs", "output", "attrs")
# Attribute spellings of CANN's rule files -> IR attribute names.
ATTR_ALIASES = {"bias": "has_bias", "weight": "has_weight"}


@dataclass(frozen=True)
class PatternNode:
    ops: frozenset[str]  # IR ops this step accepts
    op_text: str  # as written, for messages
    inputs: tuple[str, ...]  # positional input names
    output: str
    attrs: tuple[tuple[str, Any], ...] = ()
    chain: bool = False  # sequence step: consumes the previous step's output at any input position
    line: int = 0


@dataclass(frozen=True)
class Constraint:
    input_dtype: frozenset[DType] | None = None
    max_tile_size: int | None = None
    require_contiguous: bool = False
    shape: tuple[E.Expr, ...] = ()


@dataclass(frozen=True)
class Rule:
    name: str
    nodes: tuple[PatternNode, ...]
    conditions: tuple[E.Expr, ...] = ()
    constraint: Constraint = field(default_factory=Constraint)
    priority: int = 0
    becomes: str = "kernel"  # "kernel" or "library:<name>"
    source: str = ""  # file:line of the rule
    description: str = ""
    aliases: tuple[tuple[str, str], ...] = ()  # outputs of identity steps (dropout) -> the name they pass on
    enabled: bool = True  # False: off unless switched on (fusion_config "on", Options.enabled_rules)

    @property
    def outputs(self) -> frozenset[str]:
        return frozenset(n.output for n in self.nodes)

    @property
    def library(self) -> str | None:
        return self.becomes.split(":", 1)[1] if self.becomes.startswith("library:") else None


# ---- YAML with line numbers ----------------------------------------------------------------------


class _Map(dict[Any, Any]):
    line: int
    key_lines: dict[str, int]


class _Seq(list[Any]):
    line: int
    item_lines: list[int]


def _located(node: yaml.Node, ctor: yaml.constructor.SafeConstructor) -> Any:
    if isinstance(node, yaml.MappingNode):
        out = _Map()
        out.line, out.key_lines = node.start_mark.line + 1, {}
        for k, v in node.value:
            key = ctor.construct_object(k)
            out[key] = _located(v, ctor)
            out.key_lines[key] = k.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        seq = _Seq(_located(v, ctor) for v in node.value)
        seq.line, seq.item_lines = node.start_mark.line + 1, [v.start_mark.line + 1 for v in node.value]
        return seq
    return ctor.construct_object(node)


def _line(obj: Any, default: int) -> int:
    return getattr(obj, "line", default)


class _Ctx:
    def __init__(self, filename: str) -> None:
        self.filename = filename

    def fail(self, line: int, msg: str) -> RuleFileError:
        return RuleFileError(f"{self.filename}:{line}: {msg}")


def _closest(word: str, options: tuple[str, ...] | list[str]) -> str:
    m = difflib.get_close_matches(str(word), list(options), n=1)
    return f" (did you mean {m[0]!r}?)" if m else ""


def parse_rules(
    text: str, filename: str = "<rules>", known_libraries: frozenset[str] | None = None
) -> tuple[Rule, ...]:
    ctx = _Ctx(filename)
    try:
        root_node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(e, "problem", None) or str(e)
        raise ctx.fail(line, f"YAML syntax error: {problem}") from None
    if root_node is None:
        return ()
    doc = _located(root_node, yaml.SafeLoader(""))
    if not isinstance(doc, _Map) or "fusion_rules" not in doc:
        raise ctx.fail(_line(doc, 1), "expected a mapping with a top-level 'fusion_rules:' list")
    extra = [k for k in doc if k != "fusion_rules"]
    if extra:
        raise ctx.fail(
            doc.key_lines[extra[0]], f"unknown top-level key {extra[0]!r}; only 'fusion_rules' is read"
        )
    rules_list = doc["fusion_rules"]
    if rules_list is None:
        return ()
    if not isinstance(rules_list, _Seq):
        raise ctx.fail(doc.key_lines["fusion_rules"], "'fusion_rules' must be a list of rules")
    rules: list[Rule] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(rules_list):
        line = rules_list.item_lines[i]
        rule = _parse_rule(entry, line, ctx, known_libraries)
        if rule.name in seen:
            raise ctx.fail(line, f"rule {rule.name!r} is defined twice (first at line {seen[rule.name]})")
        seen[rule.name] = line
        rules.append(rule)
    return tuple(rules)


def load_rules(path: str | Path, known_libraries: frozenset[str] | None = None) -> tuple[Rule, ...]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise RuleFileError(f"{p}:0: cannot read rule file: {e.strerror or e}") from None
    return parse_rules(text, str(p), known_libraries)


def _parse_rule(entry: Any, line: int, ctx: _Ctx, known_libraries: frozenset[str] | None) -> Rule:
    if not isinstance(entry, _Map):
        raise ctx.fail(line, "each rule must be a mapping with at least 'name' and 'pattern' or 'nodes'")
    kl = entry.key_lines
    for k in entry:
        if k not in RULE_KEYS:
            raise ctx.fail(kl[k], f"unknown rule field {k!r}{_closest(k, RULE_KEYS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ctx.fail(kl.get("name", line), "rule 'name' must be a non-empty string")
    name = name.strip()
    if ("pattern" in entry) == ("nodes" in entry):
        raise ctx.fail(line, f"rule {name!r} needs exactly one of 'pattern' (op sequence) or 'nodes' (DAG)")
    aliases: dict[str, str] = {}
    if "pattern" in entry:
        nodes = _sequence(entry["pattern"], kl["pattern"], ctx)
    else:
        nodes = _dag(entry["nodes"], kl["nodes"], ctx, aliases)
    if not nodes:
        raise ctx.fail(line, f"rule {name!r} matches nothing (every step is an identity op)")
    bound = {n.output for n in nodes} | {i for n in nodes for i in n.inputs} | {"out"} | set(aliases)
    if "pattern" in entry:
        bound |= {f"x{j}" for j in range(4)}
    conditions = _exprs(entry.get("conditions", []), kl.get("conditions", line), ctx, bound, "conditions")
    constraint = _constraint(entry.get("constraint"), kl.get("constraint", line), ctx, bound)
    priority = entry.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ctx.fail(kl.get("priority", line), f"priority must be an integer, got {priority!r}")
    becomes = entry.get("becomes", "kernel")
    if not isinstance(becomes, str) or not (becomes == "kernel" or becomes.startswith("library:")):
        raise ctx.fail(
            kl.get("becomes", line), f"becomes must be 'kernel' or 'library:<name>', got {becomes!r}"
        )
    if becomes.startswith("library:") and known_libraries is not None:
        lib = becomes.split(":", 1)[1]
        if lib not in known_libraries:
            raise ctx.fail(
                kl["becomes"],
                f"unknown library implementation {lib!r}{_closest(lib, sorted(known_libraries))}; "
                f"known: {', '.join(sorted(known_libraries))}",
            )
    desc = entry.get("description", "")
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ctx.fail(kl.get("enabled", line), f"enabled must be true or false, got {enabled!r}")
    return Rule(
        name.strip(),
        nodes,
        conditions,
        constraint,
        priority,
        becomes,
        f"{ctx.filename}:{line}",
        str(desc),
        tuple(sorted(aliases.items())),
        enabled,
    )


def _resolve(op: Any, line: int, ctx: _Ctx) -> tuple[frozenset[str] | None, str]:
    alts = op if isinstance(op, list) else [op]
    if not alts or not all(isinstance(a, str) for a in alts):
        raise ctx.fail(line, f"op type must be a name or a list of names, got {op!r}")
    ops: set[str] = set()
    identity = 0
    for a in alts:
        try:
            r = resolve(a)
        except UnknownOpName as e:
            raise ctx.fail(line, str(e)) from None
        if r is None:
            identity += 1
        else:
            ops |= r
    if identity and ops:
        raise ctx.fail(line, f"{op!r} mixes an identity-in-eval op (dropout) with real ops")
    return (None if identity else frozenset(ops)), "|".join(alts)


def _sequence(steps: Any, line: int, ctx: _Ctx) -> tuple[PatternNode, ...]:
    if not isinstance(steps, _Seq) or not steps:
        raise ctx.fail(line, "'pattern' must be a non-empty list of '- op_type: <name>' steps")
    out: list[PatternNode] = []
    used: dict[str, int] = {}
    prev = ""
    for i, step in enumerate(steps):
        sl = steps.item_lines[i]
        if isinstance(step, str):
            op = step
        elif isinstance(step, _Map) and set(step) <= {"op_type", "op"} and len(step) == 1:
            op = next(iter(step.values()))
        else:
            raise ctx.fail(sl, "each pattern step is '- op_type: <name>'")
        ops, text = _resolve(op, sl, ctx)
        if ops is None:
            continue
        base = text.split("|")[0].lower().replace("_", "")
        used[base] = used.get(base, 0) + 1
        name = f"{base}_out" if used[base] == 1 else f"{base}_out{used[base]}"
        inputs = (
            (prev,)
            if prev
            else tuple(f"x{j}" for j in range(min((get_op(o).min_inputs for o in ops), default=1)))
        )
        out.append(PatternNode(ops, text, inputs, name, (), bool(prev), sl))
        prev = name
    return tuple(out)


def _dag(nodes: Any, line: int, ctx: _Ctx, rename: dict[str, str]) -> tuple[PatternNode, ...]:
    if not isinstance(nodes, _Seq) or not nodes:
        raise ctx.fail(line, "'nodes' must be a non-empty list of {op, inputs, output} mappings")
    out: list[PatternNode] = []
    outputs: dict[str, int] = {}
    for i, n in enumerate(nodes):
        nl = nodes.item_lines[i]
        if not isinstance(n, _Map):
            raise ctx.fail(nl, "each node is a mapping with 'op' and 'inputs'")
        for k in n:
            if k not in NODE_KEYS:
                raise ctx.fail(n.key_lines[k], f"unknown node field {k!r}{_closest(k, NODE_KEYS)}")
        op = n.get("op", n.get("op_type"))
        if op is None:
            raise ctx.fail(nl, "node needs 'op'")
        ops, text = _resolve(op, nl, ctx)
        inputs = n.get("inputs", [])
        if not isinstance(inputs, list) or not all(isinstance(x, str) and x for x in inputs):
            raise ctx.fail(n.key_lines.get("inputs", nl), f"'inputs' must be a list of names, got {inputs!r}")
        inputs = [rename.get(x, x) for x in inputs]
        default_out = text.split("|")[0].lower().replace("_", "") + "_out"
        output = n.get("output", default_out)
        if not isinstance(output, str) or not output.isidentifier():
            raise ctx.fail(n.key_lines.get("output", nl), f"'output' must be a name, got {output!r}")
        if ops is None:  # dropout and friends: the identity in eval
            if len(inputs) != 1:
                raise ctx.fail(nl, f"identity step {text!r} takes one input")
            rename[output] = inputs[0]
            continue
        if output in outputs:
            raise ctx.fail(nl, f"output name {output!r} is already used at line {outputs[output]}")
        outputs[output] = nl
        attrs = _attrs(n.get("attrs"), n.key_lines.get("attrs", nl), ops, ctx)
        max_in = max((get_op(o).max_inputs or 99) for o in ops)
        if len(inputs) > max_in:
            raise ctx.fail(nl, f"{text} takes at most {max_in} inputs, the pattern names {len(inputs)}")
        out.append(PatternNode(ops, text, tuple(inputs), output, attrs, False, nl))
    for k, n in enumerate(out):
        for x in n.inputs:
            if x in outputs and not any(m.output == x for m in out[:k]):
                raise ctx.fail(
                    n.line, f"input {x!r} is the output of a later node; list nodes producers first"
                )
    consumed = {x for n in out for x in n.inputs}
    ends = [n for n in out if n.output not in consumed]
    if len(ends) != 1:
        raise ctx.fail(
            line,
            f"a DAG pattern needs exactly one final node (not consumed by another); "
            f"found {', '.join(n.output for n in ends)}",
        )
    if ends[0] is not out[-1]:
        raise ctx.fail(ends[0].line, "the final node of a DAG pattern must be listed last")
    return tuple(out)


def _attrs(attrs: Any, line: int, ops: frozenset[str], ctx: _Ctx) -> tuple[tuple[str, Any], ...]:
    if attrs is None:
        return ()
    if not isinstance(attrs, _Map):
        raise ctx.fail(line, "'attrs' must be a mapping")
    known = {a for o in ops for a in (*get_op(o).required_attrs, *get_op(o).optional_attrs)}
    out = []
    for k, v in attrs.items():
        ir = ATTR_ALIASES.get(k, k)
        if ir not in known:
            raise ctx.fail(
                attrs.key_lines[k],
                f"{'/'.join(sorted(ops))} has no attribute {k!r}{_closest(ir, sorted(known))}",
            )
        out.append((ir, tuple(v) if isinstance(v, list) else v))
    return tuple(out)


def _exprs(items: Any, line: int, ctx: _Ctx, bound: set[str], what: str) -> tuple[E.Expr, ...]:
    if items is None:
        return ()
    if isinstance(items, str):
        items = _Seq([items])
        items.line, items.item_lines = line, [line]
    if not isinstance(items, list):
        raise ctx.fail(line, f"'{what}' must be a list of expressions")
    out = []
    for i, text in enumerate(items):
        il = getattr(items, "item_lines", [line] * len(items))[i]
        try:
            e = E.parse(text)
        except E.ExprError as err:
            raise ctx.fail(il, f"bad condition: {err}") from None
        unknown = sorted(e.names() - bound)
        if unknown:
            raise ctx.fail(
                il,
                f"condition {text!r} names {unknown[0]!r}, which the pattern does not bind"
                f"{_closest(unknown[0], sorted(bound))}; bound: {', '.join(sorted(bound))}",
            )
        out.append(e)
    return tuple(out)


def _constraint(c: Any, line: int, ctx: _Ctx, bound: set[str]) -> Constraint:
    if c is None:
        return Constraint()
    if not isinstance(c, _Map):
        raise ctx.fail(line, "'constraint' must be a mapping")
    for k in c:
        if k not in CONSTRAINT_KEYS:
            raise ctx.fail(
                c.key_lines[k],
                f"unknown constraint {k!r}{_closest(k, CONSTRAINT_KEYS)}; "
                f"known: {', '.join(CONSTRAINT_KEYS)}",
            )
    dtypes = None
    if "input_dtype" in c:
        raw = c["input_dtype"]
        kl = c.key_lines["input_dtype"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, _Seq) or not raw:
            raise ctx.fail(kl, "input_dtype must be a non-empty list of dtype names")
        names = [d.name for d in DType]
        dts = set()
        for d in raw:
            key = {
                "float": "float32",
                "half": "float16",
                "bf16": "bfloat16",
                "fp16": "float16",
                "fp32": "float32",
            }.get(str(d), str(d))
            if key not in names:
                raise ctx.fail(
                    kl, f"input_dtype {d!r} is not a dtype{_closest(key, names)}; known: {', '.join(names)}"
                )
            dts.add(DType[key])
        dtypes = frozenset(dts)
    tile = c.get("max_tile_size")
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
        raise ctx.fail(
            c.key_lines["max_tile_size"], f"max_tile_size must be a positive integer, got {tile!r}"
        )
    contiguous = c.get("require_contiguous", False)
    if not isinstance(contiguous, bool):
        raise ctx.fail(
            c.key_lines["require_contiguous"], f"require_contiguous must be true or false, got {contiguous!r}"
        )
    shape = _exprs(c.get("shape"), c.key_lines.get("shape", line), ctx, bound, "shape")
    return Constraint(dtypes, tile, contiguous, shape)
