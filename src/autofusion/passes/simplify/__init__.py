"""Graph simplification passes: constant folding, algebraic rules, common-subexpression and dead-node
elimination."""
