"""Op-type names in rule files: IR names, ATen names and ONNX/CANN-style names, mapped onto IR ops.

In: a name as a user writes it ("Relu", "aten.relu.default", "relu", "LayerNorm", "MatMul").
Out: the set of IR ops it stands for (`resolve`), or an error listing the closest known names.

A name may stand for several IR ops: "MatMul" is any of mm, bmm, addmm and linear's plain cousins,
"Conv" is conv (transposed convolutions are refused by the conv rules themselves, not by the name).
"Dropout" maps to nothing: in eval mode the frontend already removed it (it is the identity), so a
pattern step naming it is skipped.
"""

from __future__ import annotations

import difflib
import re

from autofusion.ir.ops import all_ops

# ONNX / CANN / PyTorch-module spellings (lower-cased, without '_') -> IR ops.
_ALIASES: dict[str, tuple[str, ...]] = {
    "matmul": ("mm", "bmm"),
    "batchmatmul": ("bmm",),
    "batchmatmulv2": ("bmm",),
    "gemm": ("addmm", "linear"),
    "fullyconnection": ("linear",),
    "conv2d": ("conv",),
    "conv1d": ("conv",),
    "conv3d": ("conv",),
    "convolution": ("conv",),
    "batchnorm": ("batch_norm",),
    "batchnormalization": ("batch_norm",),
    "batchnorm2d": ("batch_norm",),
    "layernormalization": ("layer_norm",),
    "layernorm": ("layer_norm",),
    "rmsnorm": ("rms_norm",),
    "softmaxv2": ("softmax",),
    "logsoftmax": ("log_softmax",),
    "realdiv": ("div",),
    "addv2": ("add",),
    "max": ("maximum",),
    "min": ("minimum",),
    "relu6": ("clamp",),
    "swish": ("silu",),
    "fastgelu": ("gelu",),
    "select": ("where",),  # ONNX/CANN Select is torch.where; our "select" is indexing (use its IR name)
    "transpose": ("permute",),
    "transposed": ("permute",),
    "view": ("reshape",),
    "flatten": ("reshape",),
    "squeeze": ("reshape",),
    "unsqueeze": ("reshape",),
    "concatv2": ("concat",),
    "cat": ("concat",),
    "gatherv2": ("index_select", "gather"),
    "scaleddotproductattention": ("sdpa",),
    "castv2": ("cast",),
    "dropout": (),
}
# Names that are the identity in eval mode: a pattern step naming them is skipped.
IDENTITY_IN_EVAL = frozenset({"dropout", "featuredropout", "alphadropout", "identity"})


class UnknownOpName(ValueError):
    def __init__(self, name: str, suggestions: list[str]) -> None:
        hint = f"; closest: {', '.join(suggestions)}" if suggestions else ""
        super().__init__(f"unknown op type {name!r}{hint}")
        self.name = name
        self.suggestions = suggestions


def _key(name: str) -> str:
    """'aten.relu.default' -> 'relu'; 'LayerNorm' -> 'layernorm'; 'layer_norm' -> 'layernorm'."""
    n = name.strip()
    m = re.fullmatch(r"(?:torch\.ops\.)?aten\.([A-Za-z0-9_]+)(?:\.[A-Za-z0-9_]+)?", n)
    if m:
        n = m.group(1)
    return n.lower().replace("_", "")


def _ir_by_key() -> dict[str, str]:
    return {_key(op): op for op in all_ops()}


def known_names() -> list[str]:
    """Every spelling accepted, for error messages (IR names first, then aliases in their display form)."""
    return sorted(all_ops()) + sorted(_ALIASES) + ["Dropout"]


def resolve(name: str) -> frozenset[str] | None:
    """IR ops `name` stands for; None for an identity-in-eval op (skip the step). Raises UnknownOpName."""
    k = _key(name)
    if k in IDENTITY_IN_EVAL:
        return None
    ir = _ir_by_key()
    if k in ir:
        return frozenset({ir[k]})
    if k in _ALIASES:
        return frozenset(_ALIASES[k])
    # aten spellings with an overload suffix or trailing '_' (in-place) map onto the functional op.
    if k.rstrip("_") in ir:
        return frozenset({ir[k.rstrip("_")]})
    pool = {**{_key(o): o for o in all_ops()}, **{a: a for a in _ALIASES}}
    close = difflib.get_close_matches(k, list(pool), n=4, cutoff=0.6)
    raise UnknownOpName(name, [pool[c] for c in close])
