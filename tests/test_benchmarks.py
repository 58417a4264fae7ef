"""The benchmarks run and report what docs/performance.md quotes (figures are not checked here)."""
import json
import subprocess
import sys

import pytest
from conftest import REPO, SHARED_DATA


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


def test_calibration_repeatability_compares_bundles_point_by_point(tmp_path):
    import shutil

    import pandas as pd

    bundle = REPO / "calibration" / "cpu" / "smollm2-135m"
    slower = tmp_path / "slower"
    shutil.copytree(bundle, slower)
    frame = pd.read_parquet(slower / "profile.parquet")
    frame["seconds"] *= 1.1
    frame.to_parquet(slower / "profile.parquet", index=False)
    proc = subprocess.run([sys.executable, "benchmarks/calibration_repeatability.py", str(bundle), str(slower)],
                          cwd=REPO, capture_output=True, text=True, check=True)
    assert f"{len(frame)} shared points, median |B/A - 1| 10.0%" in proc.stdout
    assert "median B/A 1.100" in proc.stdout

    other = tmp_path / "other"
    shutil.copytree(bundle, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["dtype"] = "bf16"
    (other / "meta.json").write_text(json.dumps(meta))
    proc = subprocess.run([sys.executable, "benchmarks/calibration_repeatability.py", str(bundle), str(other)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: the bundles are of different")


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


def test_machine_drift_probes_runs_and_reads_them_back(tmp_path):
    text = SHARED_DATA / "pride_and_prejudice.txt"
    if not text.exists():
        pytest.skip("needs ../shared/data")
    out = tmp_path / "drift"
    argv = [sys.executable, "benchmarks/machine_drift.py", "--text", str(text), "--iterations", "1", "--context", "64",
            "--max-new-tokens", "2", "--out", str(out)]
    first = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=True)
    report = json.loads(first.stdout)["per_batch"]
    assert set(report) == {"1", "8"} and all(b["runs"] == 1 and b["tok_s_median"] > 0 for b in report.values())
    saved = json.loads((out / "probes.json").read_text())
    assert saved["provenance"]["git_revision"] and saved["provenance"]["seed"] == 0
    assert all(r["before"]["decode_s"] > 0 and r["after"]["prompt_s"] > 0 for r in saved["runs"])
    # Run again on the folder: read back, not run again, and predicted with a bundle.
    again = subprocess.run(argv + ["--bundle", str(REPO / "calibration" / "cpu" / "smollm2-135m")], cwd=REPO,
                           capture_output=True, text=True, check=True)
    assert "machine_drift:" not in again.stderr and "tok/s, decode probe" not in again.stderr
    predictions = json.loads(again.stdout)["per_batch"]["8"]["prediction"]
    assert set(predictions) == {"cost model", "cost model @ probe"}
    # One run per batch: its error is the median and the worst.
    at_probe = predictions["cost model @ probe"]
    assert at_probe["median_abs_error"] == at_probe["worst_abs_error"] == abs(at_probe["median_error"])


def test_autoregressive_check_measures_each_setting_by_its_median_repeat(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("validate_ar", REPO / "benchmarks" / "validate_ar_calibrated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = lambda run, batch, measured, predicted: {"run": run, "prediction": "cost model", "batch": str(batch),
                                                   "measured_tok_s": str(measured), "predicted_tok_s": str(predicted)}
    # Three repeats of one setting (one in a slow spell) and two of another.
    module.print_median_of_repeats([row("chat-b1-r0", 1, 20.0, 21.0), row("chat-b1-r1", 1, 14.0, 21.0),
                                    row("chat-b1-r2", 1, 21.0, 21.0), row("context512-b1-r0", 1, 10.0, 9.0),
                                    row("context512-b1-r1", 1, 10.0, 9.0)])
    out = capsys.readouterr().out
    assert "chat-b1        measured   20.00 tok/s over 3 repeats, predicted   21.00, error +5.0%" in out
    assert "context512-b1  measured   10.00 tok/s over 2 repeats, predicted    9.00, error -10.0%" in out
    assert "cost model, batch 1, median of repeats: median |error| 7.5%, worst 10.0% over 2 settings" in out

    # Each setting's live decode forward (steps.parquet) against the bundle's price of the same shape.
    pytest.importorskip("torch")
    runs = sorted((REPO / "validation" / "ar-cpu-1002").glob("chat-b*-r[01]"))
    module.print_decode_forwards(runs, REPO / "calibration" / "cpu" / "smollm2-135m")
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("chat-b")]
    # Batch 1 decodes alone; the batch of 8 shrinks as its requests finish, each size on its own line.
    assert [line[0] for line in lines][:2] == ["chat-b1", "chat-b8"] and len(lines) > 2
    phases = [(line[0], int(line[2].rstrip(",")), int(line[3])) for line in lines]
    assert phases[0][:2] == ("chat-b1", 1) and phases[1][:2] == ("chat-b8", 8)
    assert [p[1] for p in phases[1:]] == sorted((p[1] for p in phases[1:]), reverse=True)
    assert sum(p[2] for p in phases[1:]) == 127          # 128 new tokens: the first comes with the prompt
    for line in lines:
        live, priced = float(line[line.index("live") + 1]), float(line[line.index("priced") + 1])
        assert 20 < live < 200 and 20 < priced < 200     # ms: a SmolLM2 decode forward on this CPU class


def test_forward_factor_forms_predicts_each_setting_with_both_forms():
    # The bundle made on the VM of these runs, minutes before them (the committed one is of a later VM).
    bundle = "calibration/cpu/repeats/smollm2-135m-0500"
    proc = subprocess.run([sys.executable, "benchmarks/forward_factor_forms.py", "--bundles", bundle,
                           "--ar", "validation/ar-cpu"], cwd=REPO, capture_output=True, text=True, check=True)
    line = proc.stdout.strip()
    assert line.startswith(f"{bundle} | validation/ar-cpu | ")
    cells = dict(cell.split(" ", 1) for cell in line.split(" | ")[2:])
    assert set(cells) == {"chat-b1", "chat-b8", "context512-b1", "context512-b8"}
    plane, table = (float(x.rstrip("%")) for x in cells["chat-b1"].split(" -> "))
    # The plane's bias at one token: chat prompts at batch 1 priced slow, the measured table not.
    assert plane < table and abs(table) < abs(plane)
    bad = subprocess.run([sys.executable, "benchmarks/forward_factor_forms.py", "--bundles", "no/such/bundle"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: no such folder: no/such/bundle"


def test_decode_forward_level_times_bursts_against_a_decoding_run():
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "benchmarks/decode_forward_level.py", "--batch", "2", "--kv", "48",
                           "--new-tokens", "4", "--rounds", "1"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("2 | 1 | ")]
    assert len(rows) == 1 and float(rows[0][2]) > 0 and float(rows[0][3]) > 0
    assert "batch 2: run / burst median" in proc.stdout
    bad = subprocess.run([sys.executable, "benchmarks/decode_forward_level.py", "--rounds", "0"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_decode_burst_sampling_reads_every_burst_and_the_one_a_round_choices(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("decode_burst_sampling",
                                                  REPO / "benchmarks" / "decode_burst_sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    # Two rounds of three bursts: every choice of one per round, 3 x 3 = 9 medians.
    assert sorted(module.one_burst_a_round_medians([1.0, 2.0, 3.0, 5.0, 5.0, 5.0], 3)) == \
        [3.0, 3.0, 3.0, 3.5, 3.5, 3.5, 4.0, 4.0, 4.0]
    # Three rounds of bursts at 100, 200 and 300 ms: of the 27 one-a-round medians, 7 are 100 ms,
    # 13 are 200 and 7 are 300, so the median |deviation| from 200 ms is 50%.
    meta = {"rounds": 3, "fits": {"forward_factor": {"tokens": [1, 32], "kv": [256], "factor": [[1.0], [1.0]],
                                                     "bursts_s": [[[0.1, 0.2, 0.3] * 3], [[0.5, 0.5, 0.5]]]}}}
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "meta.json").write_text(json.dumps(meta))
    proc = subprocess.run([sys.executable, "benchmarks/decode_burst_sampling.py", str(bundle)], cwd=REPO,
                          capture_output=True, text=True, check=True)
    # Only the decode row (1 token); 32 tokens is verification, timed once a round.
    assert "    1 |   256 |      9 |   200.0 (100.0-300.0) | 50.0% (-50.0% to +50.0%)" in proc.stdout
    assert "median over 1 shapes" in proc.stdout
    # Refitted fits came in the refit's rounds: 9 rounds of one burst leave one choice, all of them.
    meta["refit"] = {"rounds": 9}
    (bundle / "meta.json").write_text(json.dumps(meta))
    proc = subprocess.run([sys.executable, "benchmarks/decode_burst_sampling.py", str(bundle)], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert "    1 |   256 |      9 |   200.0 (100.0-300.0) |  0.0% (+0.0% to +0.0%)" in proc.stdout
    del meta["fits"]["forward_factor"]["bursts_s"]
    (bundle / "meta.json").write_text(json.dumps(meta))
    proc = subprocess.run([sys.executable, "benchmarks/decode_burst_sampling.py", str(bundle)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "keeps no bursts" in proc.stderr and proc.stderr.count("\n") == 1


def test_ar_check_floor_puts_one_checks_medians_in_place_of_the_prediction(tmp_path):
    def write_check(name: str, tok_s: dict[str, list[float]], predicted: dict[str, float] | None = None):
        check = tmp_path / name
        rows = []
        for setting, values in tok_s.items():
            for repeat, value in enumerate(values):
                run = check / f"{setting}-r{repeat}"
                run.mkdir(parents=True)
                batch = int(setting.rsplit("-b", 1)[1])
                (run / "summary.json").write_text(json.dumps({"batch": batch, "throughput_tok_s": value}))
                if predicted is not None:
                    rows.append(f"{run.name},cost model,{batch},{value},{predicted[setting]}")
                    rows.append(f"{run.name},cost model @ probe,{batch},{value},0.5")
        if predicted is not None:
            (check / "validation").mkdir()
            (check / "validation" / "validation.csv").write_text(
                "# provenance: {}\nrun,prediction,batch,measured_tok_s,predicted_tok_s\n" + "\n".join(rows) + "\n")
        return check

    # The first check's medians: chat-b1 20 (of 20, 19, 30), chat-b8 60; the second's 25 and 60.
    first = write_check("a", {"chat-b1": [20.0, 19.0, 30.0], "chat-b8": [60.0, 66.0, 54.0]},
                        {"chat-b1": 22.0, "chat-b8": 57.0})
    second = write_check("b", {"chat-b1": [25.0, 25.0], "chat-b8": [60.0, 60.0], "context512-b8": [40.0]})
    proc = subprocess.run([sys.executable, "benchmarks/ar_check_floor.py", str(first), str(second)], cwd=REPO,
                          capture_output=True, text=True, check=True)
    assert f"{first}: batch 1 10.0%, batch 8 5.0%" in proc.stdout       # 22 / 20 and 57 / 60, the cost model only
    assert f"{second}: no validation.csv" in proc.stdout
    assert "a -> b, batch 1: 20.0% (chat-b1 -20.0%)" in proc.stdout     # 20 predicting 25
    assert "a -> b, batch 8: 0.0% (chat-b8 +0.0%)" in proc.stdout       # only the shared setting
    assert "batch 1: 20.0% (20.0%-20.0%) over 1 pairs" in proc.stdout

    for argv, message in (([str(first)], "at least two"), ([str(first), str(tmp_path / "none")], "has no runs")):
        bad = subprocess.run([sys.executable, "benchmarks/ar_check_floor.py", *argv], cwd=REPO,
                             capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr and bad.stderr.count("\n") == 1
