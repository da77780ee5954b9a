"""Names of the extern target namespaces, and of the post-ops their calls run, that more than one layer uses.

The rule pass (`passes/rewrite/library.py`) emits extern nodes calling `autofusion_rules.<name>`; the
runtime (`runtime/library.py`) registers those operators. The name lives here, below both, so the
runtime does not import the rule pass to learn them.
"""

RULES_NAMESPACE = "autofusion_rules"

# The activations the rules' library calls apply after their GEMM or convolution (the rules match them,
# passes/rewrite/post_ops.py; runtime/library.py runs them): name -> oneDNN's post-op and its scalars.
POST_OPS_ONEDNN: dict[str, tuple[str, tuple[float, ...]]] = {
    "none": ("none", ()),
    "relu": ("relu", ()),
    "relu6": ("hardtanh", (0.0, 6.0)),
    "silu": ("swish", ()),
    "gelu": ("gelu", ()),
    "gelu_tanh": ("gelu", ()),
}
# Those `conv_bn_act` takes (GELU follows only linears here), and those after its residual add (oneDNN's
# binary post-op is followed by relu or nothing).
CONV_POST_OPS = ("none", "relu", "relu6", "silu")
RESIDUAL_POST_OPS = ("none", "relu")
