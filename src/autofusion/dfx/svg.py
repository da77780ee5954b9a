"""SVG pictures, written directly (no graphviz on the machines we target): graphs and a roofline.

In: boxes (id, text lines, CSS class) and edges in topological order; or kernels' flops, bytes and
times with a profile's peaks. Out: standalone SVG text (inline styles, so it renders in a file viewer
and inside HTML alike).

Graph layout: each box sits on the layer one below its deepest predecessor (longest path), boxes of
a layer left to right in the order given; edges are cubic curves from the bottom of the source to
the top of the target. Good enough to read a few hundred nodes; larger graphs are cut with a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

COLOURS = {
    "kernel": ("#d9f2d9", "#2e7d32"),
    "op": ("#eeeeee", "#616161"),
    "library": ("#ffe0b2", "#e65100"),
    "input": ("#dbe9ff", "#1f4e9c"),
    "output": ("#f3d9f7", "#7b1fa2"),
    "view": ("#f7f7f7", "#9e9e9e"),
}
CHAR_W, LINE_H, PAD, GAP_X, GAP_Y = 6.6, 14, 6, 18, 34
MAX_BOXES = 600


@dataclass
class Box:
    id: str
    lines: list[str]
    kind: str = "op"


def graph_svg(boxes: list[Box], edges: list[tuple[str, str]], title: str = "") -> str:
    note = ""
    if len(boxes) > MAX_BOXES:
        note = f" (first {MAX_BOXES} of {len(boxes)} nodes)"
        boxes = boxes[:MAX_BOXES]
    index = {b.id: i for i, b in enumerate(boxes)}
    preds: list[list[int]] = [[] for _ in boxes]
    for src, dst in edges:
        if src in index and dst in index and index[src] < index[dst]:
            preds[index[dst]].append(index[src])
    layer = [0] * len(boxes)
    for i in range(len(boxes)):
        layer[i] = 1 + max((layer[p] for p in preds[i]), default=-1)
    sizes = [
        (max(len(line) for line in b.lines) * CHAR_W + 2 * PAD, len(b.lines) * LINE_H + 2 * PAD)
        for b in boxes
    ]
    rows: dict[int, list[int]] = {}
    for i, lv in enumerate(layer):
        rows.setdefault(lv, []).append(i)
    pos: list[tuple[float, float]] = [(0.0, 0.0)] * len(boxes)
    y = 30.0 if title else 8.0
    width = 0.0
    for lv in sorted(rows):
        x = 8.0
        for i in rows[lv]:
            pos[i] = (x, y)
            x += sizes[i][0] + GAP_X
        width = max(width, x)
        y += max(sizes[i][1] for i in rows[lv]) + GAP_Y
    height = y
    width = max(width, len(title + note) * 7.8 + 16)  # the title is 13px bold
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" font-size="11">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#757575"/></marker></defs>',
    ]
    if title:
        out.append(f'<text x="8" y="18" font-size="13" font-weight="bold">{escape(title + note)}</text>')
    for t, ps in enumerate(preds):
        for p in ps:
            x1, y1 = pos[p][0] + sizes[p][0] / 2, pos[p][1] + sizes[p][1]
            x2, y2 = pos[t][0] + sizes[t][0] / 2, pos[t][1]
            mid = (y1 + y2) / 2
            out.append(
                f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}" '
                'fill="none" stroke="#9e9e9e" marker-end="url(#arrow)"/>'
            )
    for i, b in enumerate(boxes):
        fill, stroke = COLOURS.get(b.kind, COLOURS["op"])
        x, y0 = pos[i]
        w, h = sizes[i]
        out.append(
            f'<g class="node {escape(b.kind)}"><title>{escape(chr(10).join(b.lines))}</title>'
            f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{h:.1f}" rx="4" fill="{fill}" '
            f'stroke="{stroke}"/>'
        )
        for k, line in enumerate(b.lines):
            weight = ' font-weight="bold"' if k == 0 else ""
            out.append(
                f'<text x="{x + PAD:.1f}" y="{y0 + PAD + (k + 0.8) * LINE_H:.1f}"{weight}>'
                f"{escape(line)}</text>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


@dataclass
class RoofPoint:
    label: str
    flops: float
    bytes: float
    seconds: float
    measured: bool


def roofline_svg(points: list[RoofPoint], peak_flops: float, bandwidth: float, title: str) -> str:
    """Attainable FLOP/s = min(peak, bandwidth x intensity) on log-log axes; one dot per kernel and
    estimate kind (hollow: the cost model's estimate, filled: measured)."""
    w, h, left, bottom, top, right = 640, 400, 70, 50, 30, 20
    pts = [p for p in points if p.bytes > 0 and p.seconds > 0]
    ai = [max(p.flops, 1.0) / p.bytes for p in pts] or [0.1]
    perf = [max(p.flops, 1.0) / p.seconds for p in pts] or [1e9]
    x_lo = 10 ** math.floor(math.log10(min(min(ai), peak_flops / bandwidth) / 4))
    x_hi = 10 ** math.ceil(math.log10(max(max(ai), peak_flops / bandwidth) * 4))
    y_lo = 10 ** math.floor(math.log10(min(min(perf), bandwidth * x_lo) / 2))
    y_hi = 10 ** math.ceil(math.log10(peak_flops * 2))

    def sx(v: float) -> float:
        return left + (math.log10(v) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (
            w - left - right
        )

    def sy(v: float) -> float:
        return (
            h
            - bottom
            - (math.log10(v) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo)) * (h - top - bottom)
        )

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" fill="none" '
        'stroke="#bdbdbd"/>',
    ]
    for e in range(int(math.log10(x_lo)), int(math.log10(x_hi)) + 1):
        x = sx(10.0**e)
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{h - bottom}" stroke="#eeeeee"/>'
            f'<text x="{x:.1f}" y="{h - bottom + 14}" text-anchor="middle">1e{e}</text>'
        )
    for e in range(int(math.log10(y_lo)), int(math.log10(y_hi)) + 1):
        y = sy(10.0**e)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="#eeeeee"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>'
        )
    ridge = peak_flops / bandwidth
    roof = [(x_lo, bandwidth * x_lo), (ridge, peak_flops), (x_hi, peak_flops)]
    out.append(
        '<polyline class="roof" fill="none" stroke="#c62828" stroke-width="2" points="'
        + " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in roof)
        + '"/>'
    )
    out.append(
        f'<text x="{w - right - 4}" y="{sy(peak_flops) - 6:.1f}" text-anchor="end" fill="#c62828">'
        f"peak {peak_flops / 1e9:.0f} GFLOP/s, {bandwidth / 1e9:.0f} GB/s</text>"
    )
    out.append(
        f'<text x="{(w + left) / 2}" y="{h - 12}" text-anchor="middle">'
        "arithmetic intensity (FLOP/byte)</text>"
    )
    out.append(
        f'<text x="14" y="{(h + top) / 2}" text-anchor="middle" transform="rotate(-90 14 {(h + top) / 2})">'
        "FLOP/s</text>"
    )
    for p, a, f in zip(pts, ai, perf, strict=False):  # ai/perf hold a default when pts is empty
        fill = "#1565c0" if p.measured else "none"
        kind = "measured" if p.measured else "estimated"
        out.append(
            f'<circle class="point {kind}" cx="{sx(a):.1f}" cy="{sy(f):.1f}" r="4" fill="{fill}" '
            f'stroke="#1565c0"><title>{escape(p.label)} ({kind}): {a:.3g} FLOP/B, '
            f"{f / 1e9:.3g} GFLOP/s</title></circle>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
