"""The HTML report: it parses, its three pictures are present and valid SVG, its tables match the
plan, the improvement ratio's sign is explained; and, where Chromium is installed, a headless browser
lays out every picture."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from autofusion.tools.cli import main as cli
from autofusion.tools.diagnose.report import collect, render_html
from autofusion.tools.models import builtin

FIGURES = ("graph-before", "graph-after", "roofline")


class _Outline(HTMLParser):
    """Figures by id with the number of <svg> elements inside each, table rows by table id."""

    def __init__(self) -> None:
        super().__init__()
        self.figure: str | None = None
        self.table: str | None = None
        self.svgs: dict[str, int] = {}
        self.rows: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure":
            self.figure = a.get("id")
        elif tag == "svg" and self.figure:
            self.svgs[self.figure] = self.svgs.get(self.figure, 0) + 1
        elif tag == "table":
            self.table = a.get("id")
        elif tag == "tr" and self.table:
            self.rows[self.table] = self.rows.get(self.table, 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self.figure = None
        elif tag == "table":
            self.table = None


@pytest.fixture(scope="module")
def report() -> tuple[dict, str]:
    model, inputs = builtin("transformer-block")
    data = collect(model, inputs, "builtin:transformer-block", runs=2)
    return data, render_html(data)


def test_html_parses_with_its_pictures_and_tables(report) -> None:
    data, html = report
    outline = _Outline()
    outline.feed(html)
    assert outline.svgs == {f: 1 for f in FIGURES}
    for svg in re.findall(r"<svg.*?</svg>", html, flags=re.S):
        root = ET.fromstring(svg)  # each picture is well-formed SVG
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and float(root.get("width")) > 100
    assert (
        outline.rows["kernels"] == 1 + len(data["kernels"]) == 1 + 6
    )  # built-in rules ship off: the six fused kernels
    assert outline.rows["metrics"] == 1 + len(data["metrics"])
    assert outline.rows["decisions"] == 1 + len(data["decisions"])
    assert "negative when fusion helps" in html
    # It leads with the measured whole-model speedup, the same number as the whole-model line.
    assert html.index("Speedup, whole model") < html.index("<h2>Metrics")
    assert f"{data['speedup']:.2f}x the speed of the unfused plan" in html
    assert f"{data['unfused_ms']:.3f} ms unfused → {data['fused_ms']:.3f} ms fused" in html
    assert "seed" not in html.lower() and "§" not in html
    assert html.count("autofused_") >= 2 * len(data["kernels"])
    assert "<script>" in html and "data-svgs-rendered" in html


def test_numbers_are_consistent(report) -> None:
    data, _ = report
    m = {row["name"]: row for row in data["metrics"]}
    fused = m["fused kernels (generated; unfused: one per op)"]
    assert fused["after"] == 6 < fused["before"]
    steps = m["steps per run (fused kernels + library and view ops)"]
    assert steps["after"] < steps["before"]
    assert data["stats"] == {"fused_kernels": fused["after"], "kernels": steps["after"]}
    assert (
        m["intermediate memory traffic (between steps)"]["after"]
        < m["intermediate memory traffic (between steps)"]["before"]
    )
    assert all(k["measured_us"] > 0 and k["estimated_us"] > 0 and k["bytes"] > 0 for k in data["kernels"])
    # Times are measured, not asserted (a loaded machine moves them); only that they exist and add up.
    assert math.isfinite(data["ratio"]) and data["fused_ms"] > 0 and data["eager_ms"] > 0
    steps = m["measured latency, sum of steps timed alone (best of N)"]
    assert data["steps_ratio"] == pytest.approx((steps["after"] - steps["before"]) / steps["before"])
    # The headline (speedup, improvement ratio) is the whole-model line's numbers, so they agree.
    whole = m["measured latency, whole model (median)"]
    assert whole["before"] == pytest.approx(data["unfused_ms"] * 1e3)
    assert whole["after"] == pytest.approx(data["fused_ms"] * 1e3)
    assert data["ratio"] == pytest.approx((data["fused_ms"] - data["unfused_ms"]) / data["unfused_ms"])
    assert data["speedup"] == pytest.approx(data["unfused_ms"] / data["fused_ms"])
    json.dumps({k: v for k, v in data.items() if not k.startswith("svg_")})


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium not installed (apt-get install chromium)"
)
def test_renders_in_headless_chromium(report, tmp_path) -> None:
    _, html = report
    page = tmp_path / "report.html"
    page.write_text(html)
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,2000"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'data-svgs-rendered="{len(FIGURES)}"' in dom.stdout  # the browser laid out all three pictures
    shot = tmp_path / "report.png"
    r = subprocess.run(
        [*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and shot.stat().st_size > 10_000


def test_report_cli(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    assert (
        cli.main(["report", "dfx_test_models:chain", "--out", str(out), "--runs", "2", "--json", str(js)])
        == 0
    )
    said = capsys.readouterr().out
    assert "improvement ratio" in said and re.search(r"\d+ fused kernels?, \d+ steps? per run", said)
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert json.loads(js.read_text())["kernels"]


def test_report_when_the_build_fails(tmp_path) -> None:
    from dfx_test_models import chain

    model, inputs = chain()
    data = collect(model, inputs, "chain", {"cxx": "false", "cache_dir": str(tmp_path)}, runs=1)
    html = render_html(data)
    assert all(k["measured_us"] > 0 for k in data["kernels"])  # timed through the reference runtime
    outline = _Outline()
    outline.feed(html)
    assert outline.svgs == {f: 1 for f in FIGURES}
