"""scripts/gpu-check.sh's dry run on the CPU at SmolLM2's shape: the same parts a lent GPU runs
(the live campaign a part at a time with the synthetic drafter, a calibration that fits its budget,
SpecPV in its own part, step times and sim validate by bundle and roofline), each writing its
files; what the slot's validation rests on holds (one KV cache size per batch whatever k, nothing
captured or compiled while timed, no synthetic request off its record); and a part stopped at its
timeout leaves the others' files and its own folder without a half-written bundle. The dry run
itself is tests/conftest.py's `gpu_check_dry_run`; its calibration is also the end-to-end check of
`profiler calibrate --budget-s` (profiler/calibrate/budget.py, whose pieces
tests/profiler/test_calibrate_budget.py checks), here so that one pytest-xdist worker runs it once."""
import json
import math
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import DRY_RUN, FORWARD_OPERATORS, run_gpu_check
from profiler.calibrate.budget import END_MARGIN_S
from sim.formats.bundle import load_bundle

pytest.importorskip("torch")
pytest.importorskip("gguf")

BATCH_RUNS = ["none-b{}", "synthetic-k3-a0.8-b{}", "synthetic-k3-a0.6-b{}"]
RUNS = [r.format(b) for b in (1, 2) for r in BATCH_RUNS] + ["none-c768-b1", "specpv-k3-a0.8-b1"]


def parts(out) -> dict[str, str]:
    lines = (out / "parts.tsv").read_text().splitlines()[1:]
    return {name: status for name, status, _ in (line.split("\t") for line in lines)}


def read(out, run, name) -> dict:
    return json.loads((out / "live" / run / name).read_text())


def test_every_part_of_the_dry_run_writes_its_files(gpu_check_dry_run):
    out = gpu_check_dry_run
    assert parts(out) == {"live": "0", "calibrate": "0", "live-rest": "0", "specpv": "0", "validate": "0"}
    for name in RUNS:
        meta = read(out, name, "meta.json")
        assert meta["execution"]["cuda_graphs"] is False and meta["execution"]["launches_per_step"] > 100
        summary = read(out, name, "summary.json")
        if name.startswith(("synthetic", "specpv")):
            assert summary["synthetic"]["acceptance"] == [float(name.split("-a")[1].split("-")[0])] * 3
    assert read(out, "specpv-k3-a0.8-b1", "summary.json")["partial_verification"]["partial_steps"] > 0
    bundle = out / "calibration" / "smollm2-135m"
    assert json.loads((bundle / "meta.json").read_text())["budget"]["budget_s"] == float(DRY_RUN["CAL_BUDGET_S"])
    for folder in ("validate-roofline", "validate-calibrated"):
        text = (out / folder / "validation.csv").read_text()
        assert all(name in text for name in RUNS)
    times = (out / "step-times.txt").read_text()
    assert "weight_read_ms" in times and all(name in times for name in RUNS)
    with tarfile.open(out / "gpu-check.tgz") as tar:
        names = set(tar.getnames())
    assert {"./parts.tsv", "./environment.txt", "./live/none-b1/steps.parquet", "./live/specpv-k3-a0.8-b1/meta.json",
            "./calibration/smollm2-135m/meta.json", "./validate-calibrated/validation.csv"} <= names


def test_what_the_slots_validation_rests_on_holds_in_every_run(gpu_check_dry_run):
    out = gpu_check_dry_run
    executions = {name: read(out, name, "meta.json")["execution"] for name in RUNS}
    # One KV cache per batch whatever the run's k (its graphs captured once), SpecPV's apart.
    for batch in (1, 2):
        sizes = {executions[r.format(batch)]["cache_tokens"] for r in BATCH_RUNS}
        assert len(sizes) == 1
    assert executions["none-c768-b1"]["cache_tokens"] == executions["specpv-k3-a0.8-b1"]["cache_tokens"]
    # Nothing captured or compiled while timed; one launch count per engine shape.
    assert all(e["graph_captures_in_run"] == 0 and e["kernel_variants_in_run"] == 0 for e in executions.values())
    assert executions["synthetic-k3-a0.6-b2"]["launches_counted_by"] == "synthetic-k3-a0.8-b2"
    # The synthetic drafter's records are what the target says: no request left its record (but
    # SpecPV's, which commits what partial attention chose), and the step times flag no run.
    for name in RUNS:
        if name.startswith("synthetic"):
            assert read(out, name, "summary.json")["synthetic"]["diverged_requests"] == 0, name
    assert "SUSPECT" not in (out / "step-times.txt").read_text()


def test_a_part_stopped_at_its_timeout_leaves_the_others_intact(gpu_check_dry_run, tmp_path):
    out = gpu_check_dry_run
    shutil.copytree(out / "live", tmp_path / "live")
    # The calibration stopped a few seconds in (loading the model); validation still prices the runs
    # by the roofline, and no bundle, whole or half-written, is left.
    run_gpu_check(tmp_path, PARTS="calibrate validate", CAL_TIMEOUT="4")
    status = parts(tmp_path)
    assert status["calibrate"] in ("124", "137") and status["validate"] == "0"
    assert not (tmp_path / "calibration" / "smollm2-135m").exists()
    leftovers = list((tmp_path / "calibration").glob("*")) if (tmp_path / "calibration").exists() else []
    assert leftovers == []
    assert (tmp_path / "validate-roofline" / "validation.csv").is_file()
    assert not (tmp_path / "validate-calibrated").exists()
    assert (tmp_path / "gpu-check.tgz").is_file()


# ---- the dry run's calibration: `profiler calibrate --budget-s` end to end on SmolLM2 --------------

BUDGET_S = float(DRY_RUN["CAL_BUDGET_S"])
FORWARD = FORWARD_OPERATORS


@pytest.fixture(scope="module")
def budget_bundle(gpu_check_dry_run):
    """scripts/gpu-check.sh's calibration in its CPU dry run (tests/conftest.py): `profiler calibrate
    --budget-s 60 --operators FORWARD` of SmolLM2's shape, its output and its wall time (the part's
    seconds, the interpreter's start and exit included)."""
    out = gpu_check_dry_run
    seconds = {name: value for name, _, value in (line.split("\t") for line in
                                                  (out / "parts.tsv").read_text().splitlines()[1:])}
    return out / "calibration" / DRY_RUN["MODEL"], (out / "calibrate.log").read_text(), float(seconds["calibrate"])


def test_budgeted_calibration_ends_in_its_budget_with_a_checked_bundle(budget_bundle):
    out, stdout, wall_s = budget_bundle
    bundle = load_bundle(out)
    meta = bundle.meta
    record = meta["budget"]
    assert record["budget_s"] == BUDGET_S and f"budget {BUDGET_S:g} s" in stdout
    assert set(record["operators"]) == set(FORWARD.split(","))
    for op, timed in record["operators"].items():
        assert timed["timed"] == math.prod(len(a) for a in meta["grid"][op]["axes"].values()) <= timed["finest"]
        assert timed["timing_s"] > 0
    # Checked: the held-out points and the whole forwards at off-grid shapes, and the engine fits.
    assert meta["held_out"]["points"] == record["held_out_points"] > 0
    assert meta["held_out"]["forward_checks"] and meta["fits"]["forward_factor"]["factor"]
    phases = record["phases_s"]
    minimum_s = sum(phases[k] for k in ("setup", "minimum", "engine_round", "checkpoint"))
    if minimum_s < BUDGET_S - END_MARGIN_S:
        # The whole command, interpreter start and exit included, within the budget (and this
        # shared VM's noise): a calibration that ignored it would time all 1,100-odd points.
        assert wall_s <= 1.15 * BUDGET_S, (wall_s, phases)
        assert record["refinement"] in ("complete", "stopped for time")
    else:
        # The machine was too slow today for anything past the minimum: nothing more was timed, and
        # the summary said so.
        assert "note: over the budget" in stdout or wall_s <= 1.15 * BUDGET_S
        assert phases["refinement"] < 1.0 and record["rounds"] == 1


def test_budgeted_bundle_prices_a_scenario_and_inspect_shows_the_budget(budget_bundle, tmp_path):
    from sim.simulate import simulate

    out, _, _ = budget_bundle
    result = simulate({"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32", "calibration": str(out),
                       "workload": {"concurrency": 2, "requests": 4, "prompt_tokens": 100, "output_tokens": 16}})
    assert result.baseline.throughput_tok_s > 0
    assert result.provenance["cost_model"].startswith("calibrated:")
    run = subprocess.run([sys.executable, "-m", "profiler", "inspect", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"budget {BUDGET_S:g} s" in run.stdout and "points timed" in run.stdout
