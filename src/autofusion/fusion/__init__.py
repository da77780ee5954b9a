"""Fusion planning: which nodes share a kernel (`solver`), at what estimated gain (`cost`), without
cycles (`dag`)."""
