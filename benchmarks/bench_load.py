"""How long a saved package takes to run: `autofusion.load` and the first call, in a fresh process.

For each model: compile and save it here (weights copied), then in fresh processes with no compiler
(CXX=/nonexistent) and an empty cache directory, time
- `import`: `import torch, autofusion` (and transformers for GPT-2), before anything is loaded;
- `load -> first result`: from the import finishing to the first call's result, the target (50 ms),
  split into `autofusion.load` (which imports the runtime modules it needs) and the first call
  (folds and prepacks the weights the package did not store: MKL-packed ones, and all of them with
  weights by reference; and pays torch's and the libraries' first-use costs);
- the same with autofusion's modules imported beforehand (`modules preimported`), which separates
  module import time from the work of loading, and with `gc.freeze()` called after the imports
  (`gc-frozen`: the collector's full passes then skip torch's objects), which separates the
  collector's pass from the rest;
- eager's first call in a fresh process (the model built and its state loaded before timing), for scale;
- the same spans in CPU time (`time.process_time`, all threads): on a loaded machine wall time is mostly
  waiting for a core, CPU time much less so (OpenMP threads that spin while waiting inflate it);
- the breakdown of the total: importing the load path's modules (`import autofusion.package.loading`,
  done explicitly first), the rest of `load`, the first call, and the time the garbage collector's full
  (generation 2) passes took inside the window (`gc.callbacks`): importing torch leaves the collector
  close to a full pass (about 12,000 long-lived objects later), and one pass over torch's ~170,000
  objects takes longer than the rest of the load; the second call (steady state) for scale;
- which compiler modules (capture, passes, the fusion solver, code generation, jinja2, onnx, torch.export:
  `COMPILER`) the process imported after torch (and transformers): none is expected for a package, and
  the count of autofusion modules imported.

Models: the built-ins, `gpt2-tiny` (transformers, 2 layers, hidden 64), `zoo:NAME` (benchmarks/zoo.py at
batch 1: `zoo:bert`, `zoo:resnet`, ...) and `onnx-mlp` (an ONNX MatMul/Add/Relu/Softmax model, no eager).

Run: PYTHONPATH=src python benchmarks/bench_load.py [--models mlp,zoo:bert,onnx-mlp] [--repeat 3]
Bytecode matters here: the script lets child processes write .pyc files (to a temporary prefix).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import torch

import autofusion

MODELS = ("mlp", "transformer-block", "elementwise-chain", "layernorm", "gpt2-tiny", "zoo:bert", "zoo:resnet",
          "onnx-mlp")  # fmt: skip
# Modules of the compiler: a loaded package must run without importing any (tests/package/test_load_path.py).
COMPILER = ("autofusion.compiler", "autofusion.passes", "autofusion.fusion.solver", "autofusion.fusion.cost",
            "autofusion.codegen.cpp.render", "autofusion.codegen.cpp.gemm", "autofusion.codegen.cpp.superkernel",
            "autofusion.frontend.torch.capture", "autofusion.frontend.onnx", "autofusion.tuning", "jinja2", "onnx",
            "torch._dynamo", "torch.export")

CHILD = textwrap.dedent(
    """
    import gc, json, sys, time
    mode, name, path, compiler = sys.argv[1], sys.argv[2], sys.argv[3], tuple(json.loads(sys.argv[4]))
    t0 = time.perf_counter()
    import torch
    if name == "gpt2-tiny" or name.startswith("zoo:"):
        import transformers
    if name.startswith("zoo:"):
        sys.path.insert(0, sys.argv[5])
        import zoo
    data = torch.load(path + ".pt", weights_only=False)
    t1 = time.perf_counter()
    before = set(sys.modules)
    import autofusion
    if mode == "preimported":
        import autofusion.package.loading
    if mode == "eager":
        model = torch.load(path + ".model.pt", weights_only=False)
    if mode == "gc-frozen":
        gc.freeze()  # what a latency-minded user may do after its imports: full passes skip those objects
    full_gc = [0, 0.0]  # passes, seconds
    started = []
    def watch(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            full_gc[0] += 1
            full_gc[1] += time.perf_counter() - started.pop()
    t2 = time.perf_counter()  # the import has finished
    c2 = time.process_time()
    gc.callbacks.append(watch)
    with torch.no_grad():
        if mode == "eager":
            tm = t3 = time.perf_counter()
            c3 = time.process_time()
            out = model(*data["args"], **data["kwargs"])
        else:
            import autofusion.package.loading  # the load path's modules, timed apart
            tm = time.perf_counter()
            cm = autofusion.load(path)
            t3, c3 = time.perf_counter(), time.process_time()
            out = cm(*data["args"], **data["kwargs"])
        t4, c4 = time.perf_counter(), time.process_time()
        gc.callbacks.remove(watch)
        (model if mode == "eager" else cm)(*data["args"], **data["kwargs"])
        t5 = time.perf_counter()
    new = set(sys.modules) - before
    bad = sorted(m for m in new if any(m == c or m.startswith(c + ".") for c in compiler))
    print("RESULT" + json.dumps({"import_s": (t2 - t1) + (t1 - t0), "load_s": t3 - t2, "first_s": t4 - t3,
                                 "modules_s": tm - t2, "load_work_s": t3 - tm, "gc_passes": full_gc[0],
                                 "gc_s": full_gc[1], "second_s": t5 - t4, "total_s": t4 - t2,
                                 "load_cpu_s": c3 - c2, "first_cpu_s": c4 - c3, "total_cpu_s": c4 - c2,
                                 "af_modules": sum(m.startswith("autofusion") for m in new),
                                 "compiler_modules": len(bad), "compiler_names": bad}))
    """
)


def _onnx_mlp() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("W1", (256, 512)), ("B1", (512,)), ("W2", (512, 128)))]  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m"]), helper.make_node("Add", ["m", "B1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "W2"], ["o"]),
             helper.make_node("Softmax", ["o"], ["y"], axis=-1)]  # fmt: skip
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 256])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 128])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), (torch.from_numpy(rng.standard_normal((8, 256)).astype(np.float32)),), {}


def _model(name: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    if name == "onnx-mlp":
        return _onnx_mlp()
    if name.startswith("zoo:"):
        import zoo

        module, inputs = zoo.build(name[len("zoo:") :], batch=1)
        return module, tuple(inputs), {}
    if name == "gpt2-tiny":
        import transformers

        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg).eval()
        ids = torch.randint(0, 128, (1, 16))
        return model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    model, inputs = autofusion.builtin(name)
    return model.eval(), tuple(inputs), {}


def _child(mode: str, name: str, path: Path, env: dict[str, str]) -> dict[str, float]:
    argv = [sys.executable, "-c", CHILD, mode, name, str(path), json.dumps(COMPILER), str(Path(__file__).parent)]
    r = subprocess.run(argv, env=env,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"{name} ({mode}) failed:\n{r.stderr[-3000:]}")
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per mode (median)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(CXX="/nonexistent/g++", PYTHONPYCACHEPREFIX=str(work / "pycache"))
    src = str(Path(autofusion.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    rows = []
    sys.path.insert(0, str(Path(__file__).parent))  # zoo
    for name in args.models.split(","):
        model, pos, kw = _model(name)
        onnx_model = isinstance(model, bytes)
        with torch.no_grad():
            if onnx_model:
                cm = autofusion.compile(model)
            else:
                cm = autofusion.compile(model, pos or None, kwargs=kw or None)
            cm(*pos, **kw)
        path = work / f"{name.replace(':', '-')}.afpkg"
        autofusion.save(cm, path, weights="reference" if onnx_model else "copy")
        torch.save({"args": pos, "kwargs": kw}, str(path) + ".pt")
        if not onnx_model:
            torch.save(model, str(path) + ".model.pt")
        result: dict[str, dict[str, float]] = {}
        modes = ("package", "preimported", "gc-frozen") + (() if onnx_model else ("eager",))
        for mode in modes:
            runs = []
            for k in range(args.repeat + 1):  # the first run writes the .pyc files: not counted
                env["AUTOFUSION_CACHE_DIR"] = str(work / f"cache-{name}-{mode}-{k}")
                runs.append(_child(mode, name, path, env))
            result[mode] = {key: statistics.median(r[key] for r in runs[1:]) for key in runs[0]
                            if key != "compiler_names"}
            result[mode]["compiler_names"] = sorted({m for r in runs for m in r["compiler_names"]})
        rows.append((name, path.stat().st_size, result))
    print(f"medians of {args.repeat} fresh processes per mode; 'total' = import finished -> first result")
    print(f"{'model':18} {'package':>9} {'import':>8} | {'load':>7} {'1st call':>8} {'total':>7} {'CPU':>7} "
          f"{'af mods':>7} {'compiler':>8} | {'preimp. load':>12} {'1st':>7} {'total':>7} | {'eager 1st':>9} "
          f"{'2nd call':>8}")  # fmt: skip
    for name, size, r in rows:
        p, q = r["package"], r["preimported"]
        e = r.get("eager", {"first_s": float("nan")})
        print(f"{name:18} {size / 1024:7.0f}KB {p['import_s'] * 1e3:6.0f}ms | {p['load_s'] * 1e3:5.1f}ms "
              f"{p['first_s'] * 1e3:6.1f}ms {p['total_s'] * 1e3:5.1f}ms {p['total_cpu_s'] * 1e3:5.1f}ms "
              f"{p['af_modules']:7.0f} {p['compiler_modules']:8.0f} | {q['load_s'] * 1e3:10.1f}ms "
              f"{q['first_s'] * 1e3:5.1f}ms {q['total_s'] * 1e3:5.1f}ms | {e['first_s'] * 1e3:7.1f}ms "
              f"{p['second_s'] * 1e3:6.2f}ms")  # fmt: skip
    print("\nwith gc.freeze() after the imports (gc-frozen): total " + ", ".join(
        f"{name} {r['gc-frozen']['total_s'] * 1e3:.1f}ms" for name, _, r in rows))
    print("\nbreakdown of 'total' (package mode, medians): modules = import autofusion.package.loading; "
          "load = the rest of autofusion.load; gc = full collector passes inside the window (count)")
    print(f"{'model':18} {'total':>7} {'modules':>8} {'load':>7} {'1st call':>8} {'gc':>12} | {'2nd call':>8} "
          f"{'total-gc':>8} {'total-gc-2nd':>12}")  # fmt: skip
    for name, _, r in rows:
        p = r["package"]
        no_gc = p["total_s"] - p["gc_s"]
        print(f"{name:18} {p['total_s'] * 1e3:5.1f}ms {p['modules_s'] * 1e3:6.1f}ms {p['load_work_s'] * 1e3:5.1f}ms "
              f"{p['first_s'] * 1e3:6.1f}ms {p['gc_s'] * 1e3:6.1f}ms ({p['gc_passes']:.0f}) | "
              f"{p['second_s'] * 1e3:6.1f}ms {no_gc * 1e3:6.1f}ms {(no_gc - p['second_s']) * 1e3:10.1f}ms")  # fmt: skip
    for name, _, r in rows:
        if r["package"]["compiler_names"]:
            print(f"{name}: the package's load path imported compiler modules: {r['package']['compiler_names']}")


if __name__ == "__main__":
    main()
