"""Graph-pass benchmark: what the passes of issue 4 part 5 change, measured on this machine.

1. ATen ops -> kernels for the `transformer-block` and `resnet-block` built-ins, with every graph pass
   switched off (Options.disabled) and with the defaults.
2. Convolution layouts (seed 002 section 3.3): torch conv2d on NCHW against NHWC (channels-last) for
   the resnet-block shapes, fp32 and fp16, conversions timed separately; then the resnet-block
   compiled with channels_last forced on and off, against eager.
3. Sibling linears (horizontal_pattern): three Linear(128, 128) on one input, merged or not, for a
   small and a large number of rows.

Everything runs in one process under no_grad. Contenders of one comparison take turns within each
round, and each figure is the best round (not the median): on the shared 2-core machine other
processes' load inflates medians several-fold and unevenly, while the best round stays near the
machine's real cost.

    .venv/bin/python benchmarks/bench_passes.py [--rounds N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

import autofusion
from autofusion.passes import horizontal, layout
from autofusion.passes.manager import PASS_NAMES


def race(fns: dict[str, Callable[[], object]], rounds: int, calls: int = 5) -> dict[str, float]:
    """Best-round microseconds per call of each contender; contenders take turns within each round."""
    for f in fns.values():
        f()
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]
        for k in order:
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[k]()
            times[k].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: min(v) for k, v in times.items()}


def ops_to_kernels() -> None:
    print("## ATen ops -> kernels (fp32, default sizes)")
    print("| model | ATen ops | IR nodes | kernels, passes off | kernels, passes on | fused kernels |")
    print("|---|---|---|---|---|---|")
    for name in ("transformer-block", "resnet-block"):
        model, inputs = autofusion.builtin(name)
        off = autofusion.compile(model, inputs, disabled=frozenset(PASS_NAMES)).stats
        on = autofusion.compile(model, inputs).stats
        aten = sum(on["lowered"].values())
        print(f"| {name} | {aten} | {on['ops']} | {off['kernels']} | {on['kernels']} | {on['fused_kernels']} |")
    print()


def conv_layouts(rounds: int) -> None:
    print("## conv2d NCHW vs NHWC (resnet-block shapes, 16 -> 16 channels, 3x3, padding 1), us per call")
    print("| input | dtype | NCHW | NHWC | to NHWC | to NCHW | NHWC pays? |")
    print("|---|---|---|---|---|---|---|")
    cl = torch.channels_last
    for shape in ((2, 16, 16, 16), (8, 16, 32, 32)):
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(shape).to(dtype)
            w = torch.randn(16, 16, 3, 3).to(dtype)
            x_cl, w_cl = x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)
            y_cl = torch.conv2d(x_cl, w_cl, padding=1)
            t = race(
                {
                    "nchw": lambda: torch.conv2d(x, w, padding=1),
                    "nhwc": lambda: torch.conv2d(x_cl, w.contiguous(memory_format=cl), padding=1),
                    "to_nhwc": lambda: x.contiguous(memory_format=cl),
                    "to_nchw": lambda: y_cl.contiguous(),
                },
                rounds,
            )
            pays = t["nhwc"] + t["to_nhwc"] + t["to_nchw"] < layout.MARGIN * t["nchw"]
            print(f"| {list(shape)} | {str(dtype)[6:]} | {t['nchw']:.1f} | {t['nhwc']:.1f} | {t['to_nhwc']:.1f} "
                  f"| {t['to_nchw']:.1f} | {'yes' if pays else 'no'} |")  # fmt: skip
    print()
    print("## resnet-block, channels_last forced on / off, us per call")
    print("| batch | dtype | eager | NCHW convs | NHWC convs |")
    print("|---|---|---|---|---|")
    for batch in (2, 8):
        for dtype in (torch.float32, torch.float16):
            model, inputs = autofusion.builtin("resnet-block", dtype=dtype, batch=batch)
            compiled = {}
            for label, forced in (("nchw", "nchw"), ("nhwc", "channels_last")):
                compiled[label] = autofusion.compile(model, inputs, conv_layout=forced)
            with torch.no_grad():
                ref = model(*inputs)
                for cm in compiled.values():
                    torch.testing.assert_close(cm(*inputs), ref, rtol=2e-3, atol=2e-3)
                t = race({"eager": lambda: model(*inputs), **{k: (lambda c=c: c(*inputs)) for k, c in compiled.items()}},
                         rounds)  # fmt: skip
            print(f"| {batch} | {str(dtype)[6:]} | {t['eager']:.1f} | {t['nchw']:.1f} | {t['nhwc']:.1f} |")
    print()


class Siblings(nn.Module):
    def __init__(self, d: int = 128) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> Sequence[torch.Tensor]:
        return self.q(x).relu(), self.k(x).relu(), self.v(x).relu()


def sibling_linears(rounds: int) -> None:
    print("## three sibling Linear(128, 128) + relu, us per call")
    print("| rows | eager | separate | merged (concat weights each call) | cost model merges? |")
    print("|---|---|---|---|---|")
    torch.manual_seed(0)
    model = Siblings().eval()
    for rows in (32, 4096):
        x = torch.randn(rows, 128)
        sep = autofusion.compile(model, (x,), disabled=frozenset({"horizontal_pattern"}))
        merged = autofusion.compile(model, (x,))
        decided = sum(1 for n in merged.last.program.plan.graph.nodes if n.op == "linear") == 1  # type: ignore[union-attr]
        if not decided:  # time the merged form anyway, with the cost check forced to yes
            real = horizontal._pays
            horizontal._pays = lambda *a, **k: (True, "forced")  # type: ignore[assignment]
            merged = autofusion.compile(model, (x,))
            horizontal._pays = real  # type: ignore[assignment]
        with torch.no_grad():
            t = race({"eager": lambda: model(x), "sep": lambda: sep(x), "merged": lambda: merged(x)}, rounds)
        print(f"| {rows} | {t['eager']:.1f} | {t['sep']:.1f} | {t['merged']:.1f} | {'yes' if decided else 'no'} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with torch.no_grad():
        ops_to_kernels()
    conv_layouts(args.rounds)
    sibling_linears(args.rounds)


if __name__ == "__main__":
    main()
