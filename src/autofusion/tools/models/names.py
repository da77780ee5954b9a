"""The built-in model names, without torch: the command line lists them in `--help`.

tools/models/builtins.py defines the models and checks that it defines exactly these.
"""

BUILTIN_NAMES: tuple[str, ...] = (
    "mlp",
    "transformer-block",
    "resnet-block",
    "elementwise-chain",
    "softmax",
    "layernorm",
)
