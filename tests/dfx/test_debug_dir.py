"""TORCH_COMPILE_DEBUG run directories: one autofused_<ops>_<hash> directory per fused kernel with a
source that compiles, an SVG of its subgraph and a benchmark.py that reruns it; plain directories for
the steps that are not fused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch
import torch.nn.functional as F

import autofusion


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(24, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(F.gelu(self.fc(x)) * 2.0, -1)


def test_run_directory_layout(tmp_path) -> None:
    model, x = Block().eval(), torch.randn(8, 24)
    with torch.no_grad():
        cm = autofusion.compile(
            model,
            (x,),
            torch_compile_debug_dir=str(tmp_path),
            builtin_rules=False,
            disabled=["gemm_epilogue"],
        )  # the linear stays a plain library call
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-6)
    (run,) = tmp_path.glob("run_*-pid_*/autofusion")
    fused = sorted(run.glob("autofused_*"))
    assert len(fused) == cm.stats["fused_kernels"] >= 1
    plain = sorted(p.name for p in run.iterdir() if not p.name.startswith("autofused_"))
    assert any("_linear_" in name for name in plain), plain
    node_txt = (run / next(n for n in plain if "_linear_" in n) / "node.txt").read_text()
    assert "linear runs as a library call" in node_txt and "test_debug_dir.py" in node_txt
    k = next(d for d in fused if "gelu" in d.name)
    assert k.name.startswith("autofused_gelu_mul_amax_sub_exp_sum_div_")
    assert {"kernel.cpp", "graph.svg", "benchmark.py", "compile.sh", "meta.json", "subgraph.ir.txt"} <= {
        p.name for p in k.iterdir()
    }
    svg = ET.parse(k / "graph.svg").getroot()
    labels = " ".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    for op in ("gelu", "amax", "exp", "div", "in 0", "out 0"):
        assert op in labels
    meta = json.loads((k / "meta.json").read_text())
    assert meta["buffers"][0]["shape"] == [8, 40] and meta["params"]
    if shutil.which("g++"):
        r = subprocess.run(
            [sys.executable, str(k / "benchmark.py"), "--runs", "3"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        assert "median" in r.stdout and meta["kernel"] in r.stdout
        assert (k / "kernel.so").exists()


def test_same_kernel_same_directory(tmp_path) -> None:
    def fn(x):
        return (x.exp() * 3).sin()

    with torch.no_grad():
        for _ in range(2):
            autofusion.compile(fn, (torch.randn(5, 7),), torch_compile_debug_dir=str(tmp_path))
    (run,) = tmp_path.glob("run_*/autofusion")  # one run directory per process
    assert len(list(run.glob("autofused_exp_mul_sin_*"))) == 1


@pytest.mark.parametrize("flag,expected", [("1", True), ("0", False)])
def test_env_switch(tmp_path, monkeypatch: pytest.MonkeyPatch, flag: str, expected: bool) -> None:
    monkeypatch.setenv("TORCH_COMPILE_DEBUG", flag)
    monkeypatch.setenv("TORCH_COMPILE_DEBUG_DIR", str(tmp_path))
    with torch.no_grad():
        autofusion.compile(lambda x: x.exp() + 1, (torch.randn(3, 4),))
    assert bool(list(tmp_path.glob("torch_compile_debug/run_*/autofusion/autofused_*"))) is expected
