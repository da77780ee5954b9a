"""Debugging and observability (DFX): every decision visible, with its numbers, and tools that find
the fusion behind a problem.

- `events`: structured events (JSON-serialisable dicts) for every fusion candidate, rewrite pass,
  kernel and build, plus the short INFO summaries on the `autofusion.{fusion,rewrite,codegen,runtime}`
  logging channels.
- `trace`: what the pipeline calls at each stage; records events, writes dumps when asked.
- `dump`: AUTOFUSE_DFX_FLAGS dumps (per graph and stage; one function per format).
- `debug_dir`: TORCH_COMPILE_DEBUG=1 run directories (one per fused kernel, with benchmark.py).
- `precision`: fused kernel vs unfused reference, per group (`autofusion check`).
- `bisect`: binary search over the solver's merges (`autofusion bisect`).
- `report`: HTML report with SVG pictures (`autofusion report`).
- `cli`: the `explain`, `check`, `bisect` and `report` subcommands.
"""
