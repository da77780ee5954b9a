"""autofusion.save / autofusion.load: save in this process, load and call in a fresh one with the C++ compiler
hidden (CXX=/nonexistent) and an empty cache; results equal eager, the saved kernels ran, nothing was
captured or compiled there. Weights by reference rebind to the model given to load; copied weights need
none. ONNX models too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import autofusion
import autofusion.api
from autofusion.errors import PackageError

pytestmark = pytest.mark.skipif(os.system("g++ --version > /dev/null 2>&1") != 0, reason="needs g++")

SRC = Path(autofusion.__file__).resolve().parents[1]
# resnet-block runs library calls only (conv + folded batch norm): a package without a kernel library.
CASES = [("mlp", "reference"), ("transformer-block", "copy"), ("resnet-block", "copy")]


def _onnx_model() -> onnx.ModelProto:
    """x [4, 16] @ W [16, 8] + B -> Relu -> * 2: a MatMul on an initializer and a fused epilogue."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    two = np.array(2.0, dtype=np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"]),
        helper.make_node("Add", ["m", "B"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Mul", ["r", "two"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 8])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"),
                     numpy_helper.from_array(two, "two")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _onnx_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return np.maximum(x @ init["W"] + init["B"], 0) * init["two"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each case compiled, called once and saved, with its inputs, eager result and state_dict."""
    out = tmp_path_factory.mktemp("packages")
    made: dict[str, Any] = {"dir": out, "cases": {}}
    for name, weights in CASES:
        torch.manual_seed(0)
        model, inputs = autofusion.builtin(name)
        model.eval()
        with torch.no_grad():
            cm = autofusion.compile(model, inputs)
            cm(*inputs)
            expected = model(*inputs)
        path = out / f"{name}.afpkg"
        autofusion.save(cm, path, weights=weights)
        torch.save({"inputs": inputs, "expected": expected, "state": model.state_dict()}, out / f"{name}.pt")
        made["cases"][name] = {"path": str(path), "weights": weights, "cm": cm, "model": model,
                               "kernels": cm.stats["generated_calls"] > 0}  # fmt: skip
    model = _onnx_model()
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    cm = autofusion.compile(model.SerializeToString())
    got = cm(x)
    assert np.allclose(got.numpy(), _onnx_reference(model, x), rtol=1e-5, atol=1e-5)
    autofusion.save(cm, out / "tiny.afpkg")
    torch.save({"inputs": [torch.from_numpy(x)], "expected": torch.from_numpy(_onnx_reference(model, x))},
               out / "tiny.pt")  # fmt: skip
    made["onnx"] = {"path": str(out / "tiny.afpkg"), "model": model}
    return made


LOADER = textwrap.dedent(
    """
    import json, sys, torch
    import autofusion, autofusion.api

    def refuse(*args, **kwargs):
        raise AssertionError("a loaded package captured or compiled")

    autofusion.api.capture = refuse  # what TorchSource.capture calls
    autofusion.api.compile_graph = refuse  # what CompiledGraph calls for a signature it has no plan of
    results = {}
    for name, path, with_model in json.loads(sys.argv[1]):
        data = torch.load(path[: -len(".afpkg")] + ".pt")
        model = None
        if with_model:
            model, _ = autofusion.builtin(name)
            model.load_state_dict(data["state"])
            model.eval()
        cm = autofusion.load(path, model=model)
        with torch.no_grad():
            got = [cm(*data["inputs"]) for _ in range(2)]
        stats = cm.stats
        results[name] = {
            "equal": all(torch.allclose(g, data["expected"], rtol=1e-4, atol=1e-5) for g in got),
            "max_diff": max(float((g - data["expected"]).abs().max()) for g in got),
            "generated_calls": stats["generated_calls"], "package": stats.get("package"),
            "build_error": stats.get("build_error"), "signatures": stats["signatures"],
        }
    print("RESULTS" + json.dumps(results))
    """
)


def _run_loader(tmp: Path, jobs: list[tuple[str, str, bool]]) -> dict[str, Any]:
    script = tmp / "loader.py"
    script.write_text(LOADER)
    cache = tmp / "fresh-cache"
    env = {
        **os.environ,
        "CXX": "/nonexistent/g++",
        "AUTOFUSION_CACHE_DIR": str(cache),
        "PYTHONPATH": str(SRC),
    }
    argv = [sys.executable, str(script), json.dumps(jobs)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULTS"))
    # The libraries came from the packages into the fresh cache: built nowhere here.
    assert not list(cache.glob("kernels/*/*.failed")), "a compile was attempted in the loading process"
    return json.loads(line[len("RESULTS") :])


def test_load_in_a_fresh_process_without_a_compiler(packages: dict[str, Any], tmp_path: Path) -> None:
    jobs = [(name, c["path"], c["weights"] == "reference") for name, c in packages["cases"].items()]
    jobs.append(("tiny", packages["onnx"]["path"], False))
    results = _run_loader(tmp_path, jobs)
    kernels = {name: c["kernels"] for name, c in packages["cases"].items()}
    assert kernels["mlp"] and kernels["transformer-block"]
    for name, _, _ in jobs:
        r = results[name]
        assert r["equal"], f"{name}: loaded result differs from eager by {r['max_diff']}"
        assert r["build_error"] is None
        assert (r["generated_calls"] > 0) == kernels.get(name, True), f"{name}: generated code: {r}"
        assert r["package"] and r["package"].endswith(".afpkg") and r["signatures"] == 1


def test_package_contents(packages: dict[str, Any]) -> None:
    import zipfile

    c = packages["cases"]["mlp"]
    with zipfile.ZipFile(c["path"]) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("manifest.json"))
        index = json.loads(z.read("tensors.json"))
    assert {"manifest.json", "plan.pkl", "tensors.bin", "tensors.json"} <= names
    assert manifest["format_version"] == 2 and not {"tensors.pt", "weights.pt"} & names
    assert not [k for k in index["tensors"] if k.startswith("w:")]  # weights="reference": names only
    assert manifest["torch"] == torch.__version__ and manifest["autofusion"] == autofusion.__version__
    assert manifest["cpu_features"] and manifest["libraries"]
    for key, lib in manifest["libraries"].items():
        assert lib["file"] in names and f"libs/{key}/meta.json" in names and lib["features"]
    assert manifest["live_weights"]["fc1.weight"]["shape"] == list(c["model"].fc1.weight.shape)
    with zipfile.ZipFile(packages["cases"]["transformer-block"]["path"]) as z:
        index = json.loads(z.read("tensors.json"))
    assert [k for k in index["tensors"] if k.startswith("w:")]  # weights="copy"


def test_reference_weights_rebind_to_the_model_given(packages: dict[str, Any]) -> None:
    """A package saved with weights by reference computes with the weights of the model passed to
    load: new weights, new results (frozen folds and prepacked copies are made from them)."""
    for name in ("mlp", "transformer-block"):
        c = packages["cases"][name]
        torch.manual_seed(123)
        other, inputs = autofusion.builtin(name)
        other.eval()
        cm = autofusion.load(c["path"], model=other)
        with torch.no_grad():
            want = other(*inputs)
            got = cm(*inputs)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), name
        assert cm.stats["package"] == c["path"] and cm.stats["generated_calls"] > 0
        # The prepacked linears run the routes chosen when compiling (packed again here, from `other`).
        saved = c["cm"].compiled.program.executor.prepacked
        assert cm.compiled.program.executor.prepacked == saved, name
        with torch.no_grad():  # an in-place weight update is seen, as after a compile
            for p in other.parameters():
                p.mul_(0.5)
            assert torch.allclose(cm(*inputs), other(*inputs), rtol=1e-4, atol=1e-5), name


def test_reference_package_needs_its_model(packages: dict[str, Any]) -> None:
    with pytest.raises(PackageError, match="weights='reference'"):
        autofusion.load(packages["cases"]["mlp"]["path"])


def test_model_with_other_shapes_is_refused(packages: dict[str, Any]) -> None:
    model = torch.nn.Module()
    model.fc1 = torch.nn.Linear(3, 5)  # the package reads fc1.weight as float32[512, 256]
    with pytest.raises(PackageError, match=r"fc1\.weight as float32\[512, 256\]"):
        autofusion.load(packages["cases"]["mlp"]["path"], model=model)


def test_unsaved_signature_without_model_names_the_saved_ones(packages: dict[str, Any]) -> None:
    c = packages["cases"]["transformer-block"]
    cm = autofusion.load(c["path"])  # weights copied: no model needed
    (x,) = torch.load(packages["dir"] / "transformer-block.pt")["inputs"]
    with pytest.raises(PackageError) as info, torch.no_grad():
        cm(torch.randn(x.shape[0] + 1, *x.shape[1:]))
    message = str(info.value)
    assert "was not saved" in message and "no model was given" in message
    assert f"float32{list(x.shape)}" in message  # the saved signature, named


def test_unsaved_signature_compiles_with_the_model(packages: dict[str, Any]) -> None:
    c = packages["cases"]["mlp"]
    cm = autofusion.load(c["path"], model=c["model"])
    x = torch.randn(3, c["model"].fc1.in_features)
    with torch.no_grad():
        got = cm(x)
        want = c["model"](x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    assert cm.stats["signatures"] == 2 and "package" not in cm.stats  # compiled here
    assert cm.stats["generated_calls"] > 0


def test_onnx_package_loads_without_the_model_and_compiles_with_it(packages: dict[str, Any]) -> None:
    p = packages["onnx"]
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    cm = autofusion.load(p["path"])
    assert np.allclose(cm(x).numpy(), _onnx_reference(p["model"], x), rtol=1e-5, atol=1e-5)
    assert cm.stats["generated_calls"] > 0
    with pytest.raises(PackageError, match="no ONNX model was given"):
        cm(np.zeros((5, 16), np.float32))


def test_every_compiled_signature_is_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    xs = [torch.randn(2, 8), torch.randn(5, 8)]
    with torch.no_grad():
        cm = autofusion.compile(model)
        for x in xs:
            cm(x)
    autofusion.save(cm, tmp_path / "two.afpkg")

    def refuse(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a loaded package captured or compiled")

    monkeypatch.setattr(autofusion.api, "capture", refuse)
    monkeypatch.setattr(autofusion.api, "compile_graph", refuse)
    loaded = autofusion.load(tmp_path / "two.afpkg", model=model)
    assert loaded.stats["signatures"] == 2
    with torch.no_grad():
        for x in [*xs, xs[0]]:
            assert torch.allclose(loaded(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_loaded_model_saves_again(packages: dict[str, Any], tmp_path: Path) -> None:
    c = packages["cases"]["transformer-block"]
    data = torch.load(packages["dir"] / "transformer-block.pt")
    again = tmp_path / "again.afpkg"
    autofusion.save(autofusion.load(c["path"]), again, weights="copy")
    cm = autofusion.load(again)
    with torch.no_grad():
        assert torch.allclose(cm(*data["inputs"]), data["expected"], rtol=1e-4, atol=1e-5)
    assert cm.stats["package"] == str(again) and cm.stats["generated_calls"] > 0


def test_save_needs_a_compiled_signature(tmp_path: Path) -> None:
    cm = autofusion.compile(torch.nn.Linear(4, 4))
    with pytest.raises(PackageError, match="nothing compiled"):
        autofusion.save(cm, tmp_path / "empty.afpkg")
    with pytest.raises(ValueError, match="weights must be"):
        autofusion.save(cm, tmp_path / "x.afpkg", weights="inline")
    with pytest.raises(PackageError, match=r"what autofusion\.compile returns"):
        autofusion.save(torch.nn.Linear(4, 4), tmp_path / "x.afpkg")


def test_cli_optimize_save(tmp_path: Path) -> None:
    from autofusion.tools.cli.main import main

    path = tmp_path / "cli.afpkg"
    assert main(["optimize", "builtin:elementwise-chain", "--save", str(path)]) == 0
    cm = autofusion.load(path)  # the CLI copies the weights by default
    model, inputs = autofusion.builtin("elementwise-chain")
    with torch.no_grad():
        assert torch.allclose(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-6)
    assert cm.stats["generated_calls"] > 0


def test_hugging_face_gpt2_with_keywords(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder called with keywords, returning a ModelOutput with a cache object: saved with its
    weights, loaded without the model, and run without capture or compile."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 128, (1, 16))
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        cm = autofusion.compile(model, kwargs=kwargs)
        want = model(**kwargs)
    autofusion.save(cm, tmp_path / "gpt2.afpkg", weights="copy")

    def refuse(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a loaded package captured or compiled")

    monkeypatch.setattr(autofusion.api, "capture", refuse)
    monkeypatch.setattr(autofusion.api, "compile_graph", refuse)
    loaded = autofusion.load(tmp_path / "gpt2.afpkg")
    with torch.no_grad():
        got = loaded(**kwargs)
    assert type(got) is type(want)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5)
    assert loaded.stats["generated_calls"] > 0
