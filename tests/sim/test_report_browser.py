"""The main job end to end: `python -m sim sweep` on its default study, and its report opened in a
real headless Chromium (no console errors, every chart rendered, checked on screenshots)."""
import io
import os
import shutil
from pathlib import Path

import pytest

from sim.cli import main
from sim.sweep.store import read_table

CHROMIUM = os.environ.get("SPECSIM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Debian's chromium and sets SPECSIM_REQUIRE_BROWSER=1: there a missing browser fails.
REQUIRED = os.environ.get("SPECSIM_REQUIRE_BROWSER") == "1"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def default_sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("default") / "sweep"
    assert main(["sweep", "--out", str(out), "--quiet"]) == 0
    return out


def test_default_study_runs_and_writes_results(default_sweep):
    frame, provenance = read_table(default_sweep / "results.parquet")
    assert len(frame) > 1000 and frame["id"].is_unique
    assert set(frame["group"]) == {"llama-3.1-8b", "smollm2-135m-cpu"}
    assert provenance["calibrations"] and provenance["study_source"] == "embedded:default"
    spec = frame[frame.speculation != "none"]
    # The report's point: speculation both pays and hurts somewhere in this grid.
    assert (spec.speedup > 1.5).any() and (spec.speedup < 1).any()


def test_report_renders_in_headless_chromium(default_sweep, tmp_path):
    if CHROMIUM is None:
        if REQUIRED:
            pytest.fail("SPECSIM_REQUIRE_BROWSER=1 but no chromium found (apt-get install chromium)")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    Image = pytest.importorskip("PIL.Image")
    html = default_sweep / "report.html"
    expected = html.read_text().count('class="plotly-graph-div"')
    # heatmaps, partial verification, time shares, latency for 3 panels (SmolLM2 has partial
    # verification too), static best / goodput / oracle for the 2 Llama panels (EAGLE under both
    # policies), the validation parity plot and the published GPU cases' parity plot.
    assert expected == 16
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("request", lambda r: problems.append(f"network: {r.url}") if not r.url.startswith(("file:", "data:", "blob:")) else None)
        page.goto(html.as_uri())
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {expected}",
                               timeout=60_000)
        charts = page.query_selector_all(".js-plotly-plot")
        assert len(charts) == expected
        for i, chart in enumerate(charts):
            # rendered: plotly drew its traces (heatmap images, bars, lines or markers) ...
            drawn = chart.evaluate("el => el.querySelectorAll('.trace, .hm image, .point, .js-line').length")
            assert drawn > 0, f"chart {i} drew nothing"
            # ... and the screenshot shows it: many colours, not a blank or a single-colour box.
            shot = Image.open(io.BytesIO(chart.screenshot())).convert("RGB")
            assert shot.width > 600 and shot.height > 300
            colours = shot.getcolors(maxcolors=1 << 20)
            assert colours is not None and len(colours) > 50, f"chart {i} looks blank"
            ink = sum(n for n, c in colours if c != (255, 255, 255)) / (shot.width * shot.height)
            assert ink > 0.02, f"chart {i} is almost all white"
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        recommendation_cells = page.evaluate("document.querySelectorAll('table.rec td').length")
        assert recommendation_cells == 2 * 9 * 7 + 3 * 3
        browser.close()
    assert problems == []
