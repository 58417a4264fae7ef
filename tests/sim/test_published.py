"""`sim validate --published`: the committed catalogue loads and every case is predicted; bad
entries are one line and exit 2; anchors reproduce their measurement; speedups get error bands."""
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.bands import references, speedup_band
from sim.errors import InputError
from sim.scenario import load_scenario
from sim.validate.published.catalogue import load_catalogue
from sim.validate.published.predict import predict_catalogue, solve_anchor
from sim.validate.published.report import predictions_frame, summarize

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = REPO / "validation/published"


def test_committed_catalogue_holds_forty_cases_from_ten_sources():
    catalogue = load_catalogue(CATALOGUE)
    assert len(catalogue.entries) >= 40 and len(catalogue.sources) >= 10
    assert {e.half for e in catalogue.entries} == {"fit", "held"}
    for e in catalogue.entries:
        assert e.case.id.startswith(e.source.id), e.case.id


def test_every_case_is_predicted_and_written(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sim", "validate", "--published", str(CATALOGUE), "--out", str(tmp_path),
                           "--scenarios", str(tmp_path / "scenarios")], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "fit:" in proc.stdout and "held:" in proc.stdout
    written = sorted((tmp_path / "scenarios").glob("*.yaml"))
    assert len(written) == len(load_catalogue(CATALOGUE).entries)
    assert all(load_scenario(path).speculation.enabled for path in written)     # each case is a scenario
    lines = (tmp_path / "errors.csv").read_text().splitlines()
    assert lines[0].startswith("# provenance:") and '"git_revision"' in lines[0] and "/work" not in lines[0]
    frame = pd.read_csv(tmp_path / "errors.csv", skiprows=1)
    assert len(frame) == len(load_catalogue(CATALOGUE).entries)
    scored = frame[frame.role == "predicted"]
    assert scored.error.notna().all() and frame[frame.role == "anchor"].error.isna().all()
    assert (tmp_path / "parity.html").read_text().count("plotly") > 0


def test_anchor_reproduces_its_measurement():
    catalogue = load_catalogue(CATALOGUE)
    entry = next(e for e in catalogue.entries if e.case.id == "eagle3-sglang-h100-llama31-8b-eagle3-b2")
    anchor = solve_anchor(entry, catalogue)
    assert anchor.predicted == pytest.approx(entry.case.speedup, rel=0.01)
    assert 0 < anchor.acceptance["rate"] < 1


def test_summary_splits_the_halves():
    catalogue = load_catalogue(CATALOGUE)
    summary = summarize(predictions_frame(predict_catalogue(catalogue)))
    assert set(summary) == {"fit", "held"}
    assert summary["held"]["sources"] >= 5 and summary["fit"]["cases"] >= 20


def copy_catalogue(tmp_path) -> Path:
    root = tmp_path / "cat"
    shutil.copytree(CATALOGUE / "sources", root / "sources")
    shutil.copy(CATALOGUE / "catalogue.yaml", root / "catalogue.yaml")
    return root


def edit_first_case(root: Path, change) -> None:
    path = root / "sources/liu2026.yaml"
    document = yaml.safe_load(path.read_text())
    change(document)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.mark.parametrize("change, message", [
    (lambda d: d["cases"][0].update(flavour="x"), "liu2026.yaml: case liu2026-sglang-h100-qwen3-8b-gsm8k-chain-k3-b1: flavour: unknown field"),
    (lambda d: d.pop("source"), "liu2026.yaml: source: missing"),
    (lambda d: d["cases"][0].update(metric="latency"), "metric: 'latency' is not one of throughput, end_to_end, decode_only"),
    (lambda d: d["cases"][0].pop("acceptance"), "states no acceptance"),
    (lambda d: d["cases"][1]["parameters"].update(tree={"depth": 3, "topk": 1, "tokens": 5}), "top-k 1 is a chain of 3"),
])
def test_bad_entries_are_one_line_and_exit_2(tmp_path, change, message):
    root = copy_catalogue(tmp_path)
    edit_first_case(root, change)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_catalogue(root)
    proc = subprocess.run([sys.executable, "-m", "sim", "validate", "--published", str(root), "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "errors.csv").exists()


def test_speedup_bands_come_from_comparable_cases():
    near = load_scenario({"hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": "sglang",
                          "workload": {"concurrency": 1, "prompt_tokens": 128},
                          "speculation": {"method": "eagle", "acceptance": {"tokens_per_step": 2.25}}})
    band = speedup_band(near, 1.6)
    assert band is not None and band.basis == "held-out published cases" and band.cases
    assert band.half_width == pytest.approx(band.relative * 1.6)
    cpu = load_scenario({"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32",
                         "workload": {"concurrency": 4, "prompt_tokens": 512},
                         "speculation": {"method": "ngram", "acceptance": {"rate": 0.5}}})
    assert speedup_band(cpu, 1.2).basis == "CPU live runs"
    # Nothing comparable of its kind within reach: the band widens to its kind's held-out P90, and says so.
    far = load_scenario({"hardware": "rtx-4090", "model": "llama-3.2-1b", "workload": {"concurrency": 256, "prompt_tokens": 32768},
                         "speculation": {"method": "draft_model", "draft": {"model": "llama-3.2-1b"},
                                         "acceptance": {"rate": 0.5}}})
    wide = speedup_band(far, 1.1)
    geforce = [r for r in references() if r.hardware_class == "geforce" and not r.moe]
    assert wide.widened is not None and "P90" in wide.describe()
    assert wide.relative == pytest.approx(np.percentile([r.abs_error for r in geforce], 90))


def test_a_scenario_outside_the_catalogues_region_gets_at_least_its_kinds_held_out_p90():
    # gpt-oss-120b (a mixture of experts) at batch 1 on one H100: the nearest held cases are dense
    # models at batch 1 with errors near 1%; none of them may set its band.
    moe = load_scenario({"hardware": "h100-sxm", "model": "gpt-oss-120b", "engine": "vllm",
                         "workload": {"concurrency": 1, "prompt_tokens": 128},
                         "speculation": {"method": "eagle", "acceptance": {"tokens_per_step": 2.25}}})
    band = speedup_band(moe, 1.3)
    held_moe = [r.abs_error for r in references() if r.hardware_class == "datacenter" and r.moe]
    assert len(held_moe) >= 3
    assert band.relative >= np.percentile(held_moe, 90) and band.half_width == pytest.approx(band.relative * 1.3)
    assert "mixture-of-experts" in band.describe()
    # Its dense twin at the same regime keeps the narrow band of its comparable cases.
    dense = load_scenario({**moe.model_dump(exclude_unset=True), "model": "llama-3.1-8b", "engine": "sglang"})
    near = speedup_band(dense, 1.3)
    assert near.widened is None and near.relative < band.relative


@pytest.mark.parametrize("args, message", [
    (["--published", "no/such/folder"], "--published: no/such/folder is not a catalogue folder"),
    (["--published", str(CATALOGUE), "--calibration", "calibration/cpu/smollm2-135m"], "give no RUN_DIR or --calibration"),
    (["--published", str(CATALOGUE), "--fit", "--out", "x"], "--fit: prints the fitted settings and writes nothing"),
    (["runs/x", "--fit"], "--fit: goes with --published"),
])
def test_published_command_refuses_bad_arguments(args, message):
    proc = subprocess.run([sys.executable, "-m", "sim", "validate", *args], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_fit_recovers_the_setting_a_measurement_was_made_with(tmp_path):
    """One fit-half case whose 'measurement' is the model's own prediction at GEMM corner 2: the
    search, started from another grid point, must land on 2 with no error left."""
    from sim.validate.published.fit import Knob, fit_settings, nearest

    # The search starts at the grid point nearest the preset's value; the plain roofline's is the largest.
    assert nearest((1.0, 2.0, 64.0), 1.25) == 1.0 and nearest((1.0, 2.0, 64.0), math.inf) == 64.0

    root = copy_catalogue(tmp_path)
    keep = "specbench-rtx3090-vicuna-7b-eagle"
    for path in (root / "sources").glob("*.yaml"):
        if path.stem != "specbench":
            path.unlink()
    halves = yaml.safe_load((root / "catalogue.yaml").read_text())
    (root / "catalogue.yaml").write_text(yaml.safe_dump(halves | {"fit": ["specbench"]}))
    path = root / "sources/specbench.yaml"
    document = yaml.safe_load(path.read_text())
    document["cases"] = [c for c in document["cases"] if c["id"] == keep]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    knob = Knob("corner", "hardware", ("rtx-3090",), "gemm_corner", (1.0, 2.0, 64.0))
    predicted = {v: predict_catalogue(load_catalogue(root), half="fit", settings=knob.settings(v))[0].predicted
                 for v in knob.grid}
    assert len(set(predicted.values())) == 3            # the knob moves this case's prediction
    document["cases"][0]["speedup"] = float(predicted[2.0])
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = fit_settings(load_catalogue(root), (knob,), workers=1, log=lambda line: None)
    assert result.values == {"corner": 2.0}
    assert result.score.mean_abs_error == pytest.approx(0.0, abs=1e-9)
    assert result.presets_score.mean_abs_error > 0.0


def test_a_benchmark_tools_random_lengths_are_drawn_below_the_stated_ones():
    from sim.validate.published.scenarios import case_scenario
    from sim.workload import build_requests

    catalogue = load_catalogue(CATALOGUE)
    entry = next(e for e in catalogue.entries if e.case.id == "lmsys-blog-2025-amd-deepseek-v3-mtp-random-c64")
    assert entry.case.workload.range_ratio == 0.0
    mapping = case_scenario(entry, catalogue, {"rate": 0.8})
    width = 1023 / (2 * math.sqrt(3))
    assert mapping["workload"]["output_tokens"] == {"dist": "uniform", "mean": 512.5, "std": pytest.approx(width),
                                                    "min": 1, "max": 1024}
    requests = build_requests(load_scenario(mapping))
    for lengths in (requests.prompt_tokens, requests.output_tokens):
        assert lengths.min() >= 1 and lengths.max() <= 1024 and lengths.min() < 256 and lengths.max() > 768
