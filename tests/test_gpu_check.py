"""scripts/gpu-check.sh's dry run on the CPU at SmolLM2's shape: the same parts a lent GPU runs
(the live campaign a part at a time with the synthetic drafter, a calibration that fits its budget,
SpecPV in its own part, step times and sim validate by bundle and roofline), each writing its
files; what the slot's validation rests on holds (one KV cache size per batch whatever k, nothing
captured or compiled while timed, no synthetic request off its record); and a part stopped at its
timeout leaves the others' files and its own folder without a half-written bundle. The dry run
itself is tests/conftest.py's `gpu_check_dry_run` (its calibration serves
tests/profiler/test_calibrate_budget.py too)."""
import json
import shutil
import tarfile

import pytest

from conftest import DRY_RUN, run_gpu_check

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
