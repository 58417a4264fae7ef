"""The benchmarks run and report what docs/performance.md quotes (figures are not checked here)."""
import json
import subprocess
import sys

from conftest import REPO


def test_iteration_benchmark_reports_its_figures():
    proc = subprocess.run([sys.executable, "benchmarks/bench_sim_iterations.py", "--repeats", "1"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout)
    assert report["iterations"] > 3000
    assert report["iterations_per_s"] > 0 and report["engine_only_iterations_per_s"] > 0
    assert set(report["us_per_iteration_best"]) == {"main_baseline", "main_speculative",
                                                    "decode_only_baseline", "decode_only_speculative"}


def test_sweep_benchmark_reports_its_figures():
    proc = subprocess.run([sys.executable, "benchmarks/bench_sweep.py", "--limit", "3", "--skip-default"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout)["study_1000"]
    assert report["points"] == 3 * 4 and report["seconds"] > 0 and report["identical_without_reuse"] is True


def test_prefill_benchmark_reports_both_paths_and_their_agreement():
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    proc = subprocess.run([sys.executable, "benchmarks/bench_prefill.py", "--lengths", "80", "--repeats", "1"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout.splitlines()[-1])
    (row,) = report["rows"]
    assert row["prompt_tokens"] == 80 and row["prompt_path_s"] > 0 and row["masked_path_s"] > 0
    assert row["max_abs_logit_difference"] < 1e-3          # the same logits either way


def test_serving_benchmark_reports_both_modes_and_methods():
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from conftest import DATA_MISSING, QUESTIONS as questions

    if not questions.exists():
        pytest.skip(DATA_MISSING)
    proc = subprocess.run([sys.executable, "benchmarks/bench_serving.py", "--prompts", str(questions), "--requests", "3",
                           "--batch", "2", "--max-new-tokens", "6", "--repeats", "1"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [(r[0], r[-4]) for r in rows] == [("autoregressive", "static"), ("autoregressive", "continuous"),
                                            ("ngram", "static"), ("ngram", "continuous")]


def test_engine_ab_benchmark_times_both_revisions_interleaved():
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    proc = subprocess.run([sys.executable, "benchmarks/bench_engine_ab.py", "--base", "HEAD", "--pairs", "1",
                           "--tokens", "4", "--passes", "1"], cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(proc.stdout)
    assert report["pairs"] == 1 and report["base_tok_s_median"] > 0 and report["this_tok_s_median"] > 0
    assert report["ratio_min"] <= report["ratio_median"] <= report["ratio_max"]
    assert "pair 1: base" in proc.stderr
