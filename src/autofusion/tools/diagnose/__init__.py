"""Diagnosis tools: precision check per fused group, bisection over merges, measurement, the HTML report,
and `compare`, what every tool compares a model with."""
