"""Graph passes: each takes an immutable Graph and returns a new one (see passes/README.md)."""
