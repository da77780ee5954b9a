"""Saved compiled models: `save(compiled, path)` writes one file, `load(path, model=None)` runs it.

A package is a zip file:
- `manifest.json`: the package format version, autofusion's and torch's versions, the machine
  architecture, the CPU features every library was built to use (`codegen.cpp.build.resolved_features`)
  and the compiler and flags that built them, the source (torch or ONNX), the saved signatures (and those
  that ran eagerly, not saved), how weights are kept, and the name, shape and dtype of each model weight;
- `plan.pkl`: per signature the captured graph, the plan and its executor's structure (pickled,
  `pickling.py`);
- `tensors.pt`: the tensors the plans hold (constants, ONNX initializers), `torch.save`d;
- `weights.pt`: with `weights="copy"`, the model's parameters and buffers by name;
- `libs/<key>/`: each built kernel library (one per loop structure) and its meta.json, as in the cache.

Loading checks the manifest first (`manifest.refusal`), then installs the libraries into the disk cache
and builds each executor from its plan; no capture, no pass and no compiler runs for a saved signature.
Pickle runs code when it loads: load only packages you made or trust.
"""

from autofusion.package.loading import load
from autofusion.package.saving import save

__all__ = ["load", "save"]
