"""ONNX Unique of a constant, evaluated at import (convert.py's constant folding) with numpy.

Why not onnx.reference, which folds every other node: its Unique (onnx 1.23) with sorted=0 gets valid
nodes wrong: along an axis other than 0 it returned the wrong slices (2 of a [3, 2, 2] input's axis-1
slices where both are distinct), and without an axis it fails (IndexError) for rank >= 2. Unique of a
graph input stays refused (externs/misc.py): its output length depends on the values.

What: the spec's four outputs, as onnxruntime gives them: the unique values (flattened without `axis`,
slices along it with one), sorted ascending (slices lexicographically) or, with sorted=0, in order of
first occurrence; the index of each one's first occurrence; for each element (slice) of the input the
index of its value in the first output; the counts. With NaN numpy keeps the NaNs as one value
(onnx.reference's answer); onnxruntime's answer there comes from an ordering that NaN breaks (it merges
NaNs into other values) and is not followed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper


def fold_unique(node: onnx.NodeProto, x: np.ndarray) -> list[np.ndarray]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis = attrs.get("axis")
    if axis is None or x.ndim == 0:
        x, axis = x.reshape(-1), 0
    axis = int(axis) % x.ndim
    y, first, inverse, counts = np.unique(x, axis=axis, return_index=True, return_inverse=True,
                                          return_counts=True)  # fmt: skip
    inverse = inverse.reshape(-1)
    if not int(attrs.get("sorted", 1)):
        order = np.argsort(first, kind="stable")  # first occurrences in input order
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        y, first, counts, inverse = np.take(y, order, axis=axis), first[order], counts[order], rank[inverse]
    return [y, *(a.astype(np.int64) for a in (first, inverse, counts))]
