"""A package whose convolutions run on the "dnnl" route carries the oneDNN glue library
(codegen/cpp/dnnl_conv.py) as it carries kernel libraries: listed in the manifest's libraries (so its
CPU features join the refusal rule), checked by sha256 when installed, and handed to the route at load,
so a process with no C++ compiler and an empty cache runs the route (ROUTE_CALLS proves it ran) with
eager's results."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import autofusion
from autofusion.codegen.cpp import dnnl_conv
from autofusion.errors import PackageError
from autofusion.runtime import dnnl_route, library
from autofusion.runtime.executor import PlanExecutor
from autofusion.runtime.super_executor import SuperExecutor

pytestmark = [
    pytest.mark.skipif(os.system("g++ --version > /dev/null 2>&1") != 0, reason="needs g++"),
    pytest.mark.skipif(isinstance(dnnl_conv.find_install(), str), reason="oneDNN is not installed"),
]
SRC = Path(autofusion.__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import json, sys, torch
    import autofusion
    from autofusion.codegen.cpp import dnnl_conv
    from autofusion.runtime import library
    path, data = sys.argv[1], torch.load(sys.argv[2])
    cm = autofusion.load(path)
    with torch.no_grad():
        got = cm(data["x"])
    err = (got - data["want"]).abs().max().item()
    print("RESULT" + json.dumps({"dnnl": library.ROUTE_CALLS.get("dnnl", 0), "err": err,
                                 "why": dnnl_conv.unavailable_reason(cxx="/nonexistent/g++")}))
    """
)


class Convs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(5, 12, 3, padding=1), nn.BatchNorm2d(12)
        self.c2, self.b2 = nn.Conv2d(12, 7, 3, stride=2, padding=1), nn.BatchNorm2d(7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model = Convs().eval()
    for bn in (model.b1, model.b2):  # statistics that matter
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 5, 11, 9)
    before = library.ROUTE_CALLS.get("dnnl", 0)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,), conv_layout="dnnl")
        cm(x)
        want = model(x)
    assert library.ROUTE_CALLS.get("dnnl", 0) > before, "the compiled model did not run the dnnl route"
    d = tmp_path_factory.mktemp("glue")
    path = d / "convs.afpkg"
    autofusion.save(cm, path, weights="copy")
    torch.save({"x": x, "want": want}, d / "data.pt")
    return path, d / "data.pt"


def test_the_glue_is_a_library_of_the_package(package: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(package[0]) as z:
        manifest = json.loads(z.read("manifest.json"))
        glue = manifest["dnnl_glue"]
        assert glue is not None and glue["key"] in manifest["libraries"]
        record = manifest["libraries"][glue["key"]]
        assert record["sha256"] and set(record["features"]) <= set(manifest["cpu_features"])
        assert record["file"] in z.namelist()


def test_a_process_without_a_compiler_runs_the_route(package: tuple[Path, Path], tmp_path: Path) -> None:
    env = {**os.environ, "CXX": "/nonexistent/g++", "AUTOFUSION_CACHE_DIR": str(tmp_path / "empty-cache"),
           "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    r = subprocess.run([sys.executable, "-c", CHILD, str(package[0]), str(package[1])], env=env,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT") :])
    assert out["why"] is None
    assert out["dnnl"] >= 2  # both convolutions ran on the glue
    assert out["err"] < 1e-4


def test_a_damaged_glue_is_refused(package: tuple[Path, Path], tmp_path: Path) -> None:
    src = package[0]
    with zipfile.ZipFile(src) as z:
        manifest = json.loads(z.read("manifest.json"))
        name = manifest["libraries"][manifest["dnnl_glue"]["key"]]["file"]
        bad = tmp_path / "bad.afpkg"
        with zipfile.ZipFile(bad, "w") as out:
            for info in z.infolist():
                blob = z.read(info)
                if info.filename == name:
                    blob = blob[:-64] + bytes(64)
                out.writestr(info, blob)
    with pytest.raises(PackageError, match="cannot open its library"):
        autofusion.load(bad, cache_dir=str(tmp_path / "cache"))


class ConvChain(nn.Module):
    """Convolutions a SuperKernel entry calls on the dnnl route (a channels-last chain after the stem), and
    a pointwise kernel between them."""

    def __init__(self, c: int = 12) -> None:
        super().__init__()
        self.stem, self.b0 = nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.dw, self.b1 = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm2d(c)
        self.pw = nn.Conv2d(c, c, 1)
        self.head = nn.Conv2d(c, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b0(self.stem(x)))
        z = torch.relu(self.pw(torch.relu(self.b1(self.dw(y)))) + y)
        return self.head(torch.sigmoid(z) * z)


def test_no_glue_here_runs_kernel_by_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the glue cannot be used (oneDNN missing here, say), a package whose SuperKernel entries call
    oneDNN convolutions loads anyway: one WARNING says why, the plan runs kernel by kernel (the
    convolutions on the route's fallback) and gives eager's result."""
    torch.manual_seed(1)
    model = ConvChain().eval()
    x = torch.randn(2, 3, 13, 11)
    with torch.no_grad():
        compiled = autofusion.compile(model, (x,), conv_layout="dnnl", super_kernel="on")
        compiled(x)
        data = {"x": x, "want": model(x)}
    path = tmp_path / "super-convs.afpkg"
    autofusion.save(compiled, path, weights="copy")
    usual = autofusion.load(path, cache_dir=str(tmp_path / "cache"))
    ex = usual.last.program.executor
    ex = getattr(ex, "inner", ex)
    assert isinstance(ex, SuperExecutor) and ex.dnnl, "the package's entries call no oneDNN convolution"
    monkeypatch.setattr(dnnl_route, "glue", lambda: None)
    with caplog.at_level(logging.WARNING, logger="autofusion.package"):
        cm = autofusion.load(path, cache_dir=str(tmp_path / "cache"))
    assert "runs kernel by kernel, not as SuperKernels" in caplog.text
    assert "dnnl glue is unavailable" in caplog.text
    program = cm.last.program
    assert program.stats["super_kernel"]["on"] is False and program.super_plan is None
    before = library.ROUTE_CALLS.get("dnnl", 0)
    with torch.no_grad():
        got = cm(data["x"])
    torch.testing.assert_close(got, data["want"], rtol=1e-4, atol=1e-4)
    assert library.ROUTE_CALLS.get("dnnl", 0) == before  # the glue was not called
    inner = getattr(program.executor, "inner", program.executor)
    assert isinstance(inner, PlanExecutor)
    if program.plan.kernels:
        assert inner.generated_calls > 0  # the saved kernels ran
