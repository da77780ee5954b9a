"""Code generation: turns fused kernels of a plan into source code and builds it into loadable binaries."""
