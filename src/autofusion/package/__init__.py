"""Saved compiled models: `save(compiled, path)` writes one file, `load(path, model=None)` runs it.

A package is a zip file:
- `manifest.json`: the package format version, autofusion's and torch's versions, the machine
  architecture, the CPU features every library was built to use (`codegen.cpp.build.resolved_features`)
  and the compiler and flags that built them, the source (torch or ONNX), the saved signatures (and those
  that ran eagerly, not saved), how weights are kept, and the name, shape and dtype of each model weight;
- `plan.pkl`: per signature the captured graph, the plan and its executor's structure (pickled,
  `pickling.py`);
- `tensors.bin` and `tensors.json`: the tensors the plans hold (constants, ONNX initializers) and, with
  `weights="copy"`, the model's parameters and buffers by name, as raw bytes that loading maps
  copy-on-write (`tensorfile.py`; `tensors.pt` holds the few with no plain byte layout). Format 1
  kept them `torch.save`d in `tensors.pt` and `weights.pt`; such packages still load;
- `libs/<key>/`: each built kernel library (one per loop structure) and its meta.json, as in the cache.

Loading checks the manifest first (`manifest.refusal`), then installs the libraries into the disk cache
and builds each executor from its plan; no capture, no pass and no compiler runs for a saved signature.
Pickle runs code when it loads: load only packages you made or trust.
"""

import gc
from typing import TYPE_CHECKING, Any

# The load path's modules (~75, most of their time spent making classes) are imported with the cyclic
# collector paused: the young collections it would run in between find nothing to free (every object
# made is a module's, kept) and cost 2-5 ms of the import here (measured: 47-59 ms with it, 46-52 ms
# without, fresh processes on the loaded Xeon).
_collecting = gc.isenabled()
gc.disable()
try:
    from autofusion.package.loading import load
finally:
    if _collecting:
        gc.enable()

if TYPE_CHECKING:
    from autofusion.package.saving import save


def __getattr__(name: str) -> Any:
    if name == "save":  # on first use: a process that only loads packages does not import it
        from autofusion.package.saving import save

        return save
    raise AttributeError(f"module 'autofusion.package' has no attribute {name!r}")


__all__ = ["load", "save"]
