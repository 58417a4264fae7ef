"""scripts/gpu-check.sh's dry run on the CPU at SmolLM2's shape: the same parts a lent GPU runs
(live campaign with CUDA graphs' bookkeeping and the synthetic drafter, a calibration that fits
its budget, sim validate by bundle and roofline, step times), each writing its files; and a part
stopped at its timeout leaves the others' files and its own folder without a half-written bundle."""
import json
import os
import shutil
import subprocess
import tarfile

import pytest

from conftest import REPO

pytest.importorskip("torch")
pytest.importorskip("gguf")

# SmolLM2's shape with random weights; batches 1 and 2, one synthetic setting, SpecPV at 1,024 tokens.
DRY_RUN = {"DEVICE": "cpu", "DTYPE": "fp32", "MODEL": "smollm2-135m", "BATCHES": "1 2", "KS": "3",
           "ACCEPTANCES": "0.8", "CONTEXT": "128", "NEW_TOKENS": "12", "SPECPV_CONTEXT": "768",
           "SPECPV_BUDGET": "256", "CAL_BUDGET_S": "60", "LIVE_TIMEOUT": "240", "VALIDATE_TIMEOUT": "120",
           "PARTS": "live calibrate validate"}
RUNS = ["none-b1", "synthetic-k3-a0.8-b1", "none-b2", "synthetic-k3-a0.8-b2", "none-c768-b1", "specpv-k3-a0.8-b1"]


def run_script(out, **settings) -> str:
    env = {**os.environ, **DRY_RUN, **settings, "OUT": str(out), "TRITON_INTERPRET": "1"}
    done = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def parts(out) -> dict[str, str]:
    lines = (out / "parts.tsv").read_text().splitlines()[1:]
    return {name: status for name, status, _ in (line.split("\t") for line in lines)}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    return out, run_script(out)


def test_every_part_of_the_dry_run_writes_its_files(dry_run):
    out, printed = dry_run
    assert parts(out) == {"live": "0", "calibrate": "0", "validate": "0"}
    for name in RUNS:
        meta = json.loads((out / "live" / name / "meta.json").read_text())
        assert meta["execution"]["cuda_graphs"] is False and meta["execution"]["launches_per_step"] > 100
        summary = json.loads((out / "live" / name / "summary.json").read_text())
        if name.startswith(("synthetic", "specpv")):
            assert summary["synthetic"]["acceptance"] == [0.8] * 3
    specpv = json.loads((out / "live" / "specpv-k3-a0.8-b1" / "summary.json").read_text())
    assert specpv["partial_verification"]["partial_steps"] > 0
    bundle = out / "calibration" / "smollm2-135m"
    assert json.loads((bundle / "meta.json").read_text())["budget"]["budget_s"] == 60
    for folder in ("validate-roofline", "validate-calibrated"):
        text = (out / folder / "validation.csv").read_text()
        assert all(name in text for name in RUNS)
    times = (out / "step-times.txt").read_text()
    assert "weight_read_ms" in times and all(name in times for name in RUNS)
    with tarfile.open(out / "gpu-check.tgz") as tar:
        names = set(tar.getnames())
    assert {"./parts.tsv", "./environment.txt", "./live/none-b1/steps.parquet",
            "./calibration/smollm2-135m/meta.json", "./validate-calibrated/validation.csv"} <= names


def test_a_part_stopped_at_its_timeout_leaves_the_others_intact(dry_run, tmp_path):
    out, _ = dry_run
    shutil.copytree(out / "live", tmp_path / "live")
    # The calibration stopped a few seconds in (loading the model); validation still prices the runs
    # by the roofline, and no bundle, whole or half-written, is left.
    run_script(tmp_path, PARTS="calibrate validate", CAL_TIMEOUT="4")
    status = parts(tmp_path)
    assert status["calibrate"] in ("124", "137") and status["validate"] == "0"
    assert not (tmp_path / "calibration" / "smollm2-135m").exists()
    leftovers = list((tmp_path / "calibration").glob("*")) if (tmp_path / "calibration").exists() else []
    assert leftovers == []
    assert (tmp_path / "validate-roofline" / "validation.csv").is_file()
    assert not (tmp_path / "validate-calibrated").exists()
    assert (tmp_path / "gpu-check.tgz").is_file()
