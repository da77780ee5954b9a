"""The zoo's CNNs (benchmarks/zoo.py, tiny variants) compiled in each forced convolution layout and in
auto (the chain measurement really run on their chains) give eager's results, the forced route really
ran (ROUTE_CALLS), and each chain's decision is a layout.chain event."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import zoo

import autofusion
from autofusion.passes import layout_timing
from autofusion.runtime import library

ONEDNN = torch.backends.mkldnn.is_available()
MODELS = ["resnet", "mobilenet_v2", "efficientnet", "convnext"]
FORCED = {"nchw": "aten", "channels_last": "aten_cl", "blocked": "onednn" if ONEDNN else "aten_cl"}


@pytest.mark.parametrize("layout", [*FORCED, "auto"])
@pytest.mark.parametrize("name", MODELS)
def test_zoo_cnn_equals_eager(
    name: str, layout: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Compared with the model run in float64: the tiny models are ill-conditioned enough that eager
    fp32 itself is 2e-4 off on MobileNetV2 (outputs up to 6) and 4e-4 on EfficientNet (up to 120), so
    the bound is 1e-4 of the output's scale plus four times eager's own error (a wrong layout or
    a mis-wired chain is off by the scale itself)."""
    if layout == "auto":
        # Measure even on a loaded machine (the choice may then be anything: the values must not care),
        # in a cache of its own so the chains really are measured here.
        monkeypatch.setattr(layout_timing, "machine_busy", lambda: (False, "treated as quiet"))
        monkeypatch.setattr(layout_timing, "_TIMINGS", {})
    model, inputs = zoo.build(name, batch=1, tiny=True)
    with torch.no_grad():
        ref = model(*inputs)
        cm = autofusion.compile(model, list(inputs), conv_layout=layout, cache_dir=str(tmp_path))
        before = dict(library.ROUTE_CALLS)
        out = cm(*inputs)
    ran = {r: n - before.get(r, 0) for r, n in library.ROUTE_CALLS.items() if n - before.get(r, 0)}
    with torch.no_grad():
        ref64 = model.double()(*(x.double() for x in inputs))
    eager_err = (ref.double() - ref64).abs().max().item()
    err = (out.double() - ref64).abs().max().item()
    assert err <= 1e-4 * ref64.abs().max().item() + 4 * eager_err, (err, eager_err)
    chains = [e for e in cm.events if e["event"] == "layout.chain"]
    assert chains, "no convolution chain routed"
    if layout == "auto":
        assert {e["how"] for e in chains} <= {"measured", "unmeasured"}
        assert all(e["route"] in library.ROUTES for e in chains)
    else:
        assert {e["route"] for e in chains} == {FORCED[layout]}
        if layout == "nchw":  # (a plain conv node on the NCHW route stays a conv: no library call)
            assert set(ran) <= {"aten"}, ran
        else:
            assert ran.get(FORCED[layout], 0) > 0, ran
