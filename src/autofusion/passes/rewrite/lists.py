"""Exclusion lists: `blacklist.txt` (op types never fused) and CANN's skip list
(`--skip_node_names_cfg`: an .ini file with `[ByNodeName]` and `[ByNodeType]` sections).

In: file paths. Out: an `Exclusions` object; `reason(node, original)` says why a node is kept out of
every fused kernel and every rule window, or None. Node types accept every spelling rules accept
(IR, ATen, ONNX/CANN), checked against the op before decomposition, so `Softmax` excludes every
node softmax decomposes into. Unknown types fail with file:line and the closest names.
"""

from __future__ import annotations

import configparser
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from autofusion.ir.graph import Node
from autofusion.passes.rewrite.loader import RuleFileError
from autofusion.passes.rewrite.opnames import UnknownOpName, resolve

BUILTIN_BLACKLIST = Path(__file__).with_name("blacklist.txt")


@dataclass(frozen=True)
class Exclusions:
    types: dict[str, str] = field(default_factory=dict)  # IR op -> where it was listed
    names: dict[str, str] = field(default_factory=dict)  # node name -> where it was listed

    def __bool__(self) -> bool:
        return bool(self.types or self.names)

    def reason(self, node: Node, original: Node | None = None) -> str | None:
        src = original or node
        for n in (src, node):
            if n.op in self.types:
                return f"op type {n.op} is listed in {self.types[n.op]}"
            if n.name in self.names:
                return f"node {n.name} is listed in {self.names[n.name]}"
        return None


def _types_of(name: str, where: str) -> frozenset[str]:
    try:
        ops = resolve(name)
    except UnknownOpName as e:
        raise RuleFileError(f"{where}: {e}") from None
    return ops or frozenset()


def load_exclusions(
    blacklists: Iterable[str | Path] = (), skip_cfg: str | Path = "", builtin: bool = True
) -> Exclusions:
    types: dict[str, str] = {}
    names: dict[str, str] = {}
    files = ([BUILTIN_BLACKLIST] if builtin else []) + [Path(p) for p in blacklists]
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise RuleFileError(f"{path}:0: cannot read blacklist: {e.strerror or e}") from None
        for no, raw in enumerate(lines, 1):
            text = raw.split("#", 1)[0].strip()
            if text:
                for op in _types_of(text, f"{path}:{no}"):
                    types.setdefault(op, f"{path.name}:{no}")
    if skip_cfg:
        path = Path(skip_cfg)
        parser = configparser.ConfigParser(
            allow_no_value=True, delimiters=("=",), comment_prefixes=("#", ";")
        )
        parser.optionxform = str  # type: ignore[assignment,method-assign]  # node names are case-sensitive
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise RuleFileError(f"{path}:0: cannot read skip list: {e.strerror or e}") from None
        try:
            parser.read_string(text, source=str(path))
        except configparser.Error as e:
            line = getattr(e, "lineno", 0)
            raise RuleFileError(f"{path}:{line}: {str(e).splitlines()[0]}") from None
        known = {"ByNodeName", "ByNodeType"}
        for section in parser.sections():
            if section not in known:
                raise RuleFileError(
                    f"{path}:{_line_of(text, '[' + section)}: unknown section [{section}]; "
                    "use [ByNodeName] and [ByNodeType]"
                )
        for key in parser["ByNodeName"] if parser.has_section("ByNodeName") else []:
            names.setdefault(key.strip(), f"{path.name}:{_line_of(text, key)}")
        for key in parser["ByNodeType"] if parser.has_section("ByNodeType") else []:
            where = f"{path}:{_line_of(text, key)}"
            for op in _types_of(key.strip(), where):
                types.setdefault(op, f"{path.name}:{_line_of(text, key)}")
    return Exclusions(types, names)


def _line_of(text: str, needle: str) -> int:
    for no, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith(needle):
            return no
    return 0
