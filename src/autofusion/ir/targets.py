"""Names of the extern target namespaces that more than one layer uses.

The rule pass (`passes/rewrite/library.py`) emits extern nodes calling `autofusion_rules.<name>`; the
runtime (`runtime/library.py`) registers those operators. The name lives here, below both, so the
runtime does not import the rule pass to learn it.
"""

RULES_NAMESPACE = "autofusion_rules"
