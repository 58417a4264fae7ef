"""Hugging Face transformers as a black-box engine: its prompt-lookup decoding recorded as a live run,
and predicted by the simulator from the committed black-box bundle."""
import json
import subprocess
import sys

import pytest

from conftest import REPO, TEXT, THREADS, needs_data

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pd = pytest.importorskip("pandas")

BUNDLE = REPO / "calibration" / "cpu-hf" / "smollm2-135m"


@needs_data
def test_transformers_prompt_lookup_is_recorded_and_predicted(tmp_path):
    runs = {}
    for method in ("none", "ngram"):
        out = tmp_path / f"hf-{method}"
        proc = subprocess.run([sys.executable, "-m", "profiler", "hf-live", "--method", method, "--k", "4",
                               "--context", "256", "--text", TEXT, "--limit", "2", "--max-new-tokens", "24",
                               "--threads", str(THREADS), "--out", out], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[method] = out
    steps = pd.read_parquet(runs["ngram"] / "steps.parquet")
    requests = pd.read_parquet(runs["ngram"] / "requests.parquet")
    assert (steps.accepted <= steps.drafted).all() and (steps.drafted <= 4).all()
    # Every output token came from the first forward or a recorded step.
    for rid, own in steps.groupby("request"):
        produced = int(own.committed.sum())
        assert 1 <= requests.output_tokens[rid] - produced <= 5
    summary = json.loads((runs["ngram"] / "summary.json").read_text())
    assert summary["engine"] == "hf-transformers" and summary["tokens_per_step"] > 1.0
    ar = json.loads((runs["none"] / "summary.json").read_text())
    # Greedy prompt lookup is lossless: the same text as plain greedy decoding.
    same = [json.loads(a)["tokens"] == json.loads(b)["tokens"] for a, b in
            zip((runs["none"] / "outputs.jsonl").read_text().splitlines(),
                (runs["ngram"] / "outputs.jsonl").read_text().splitlines())]
    assert all(same) and ar["throughput_tok_s"] > 0

    proc = subprocess.run([sys.executable, "-m", "sim", "validate", runs["none"], runs["ngram"], "--calibration",
                           BUNDLE, "--out", tmp_path / "validation"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.read_csv(tmp_path / "validation" / "validation.csv", comment="#")
    replay = rows[rows.prediction == "replay"].iloc[0]
    assert replay.predicted_speedup > 0 and replay.measured_speedup > 0
    # transformers' first forward also verifies a proposal, which the simulation's prefill does not:
    # the replay can take a step or two more at the end.
    assert replay.predicted_tokens_per_step == pytest.approx(replay.measured_tokens_per_step, rel=0.15)
