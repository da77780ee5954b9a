"""A package whose convolutions run on the "dnnl" route carries the oneDNN glue library
(codegen/cpp/dnnl_conv.py) as it carries kernel libraries: listed in the manifest's libraries (so its
CPU features join the refusal rule), checked by sha256 when installed, and handed to the route at load,
so a process with no C++ compiler and an empty cache runs the route (ROUTE_CALLS proves it ran) with
eager's results."""

from __future__ import annotations

import json
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
from autofusion.runtime import library

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
