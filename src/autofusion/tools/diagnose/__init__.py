"""Diagnosis tools: precision check per fused group, bisection over merges, measurement and the HTML
report."""
