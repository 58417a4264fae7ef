"""`python -m sim sweep`, `report` and `capacity`: studies, executors, resume, bad input."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli import main
from sim.sweep.study import expand_points, load_study
from sim.sweep.store import LOG, read_table

REPO = Path(__file__).resolve().parents[2]

# A study big enough to be killed part-way: 48 points of 200 requests at concurrency 16.
KILLABLE = {
    "name": "killable",
    "base": {"hardware": "h100-sxm", "model": "llama-3.1-8b",
             "workload": {"arrival": "closed", "concurrency": 16, "requests": 200, "output_tokens": 166}},
    "grid": {"workload.prompt_tokens": [512, 1024, 2048, 4096, 8192, 16384],
             "hardware": ["h100-sxm", "h200"]},
    "methods": [{"name": "none"},
                {"name": "eagle", "set": {"speculation": {"method": "eagle", "acceptance": {"rate": 0.7}}},
                 "grid": {"speculation.num_speculative_tokens": [1, 2, 3]}}],
}


def write_study(tmp_path: Path, study: dict, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(study))
    return path


def sweep_frame(out: Path) -> pd.DataFrame:
    frame, _ = read_table(out / "results.parquet")
    return frame


def test_smoke_study_writes_table_report_and_provenance(tmp_path, capsys):
    out = tmp_path / "smoke"
    assert main(["sweep", "smoke", "--out", str(out), "--quiet", "--workers", "2"]) == 0
    frame, provenance = read_table(out / "results.parquet")
    points = expand_points(load_study("smoke"))
    assert list(frame["id"]) == [p.id for p in points]           # every point once, in study order
    assert frame["id"].is_unique
    for key in ("git_revision", "versions", "seeds", "hardware", "dtypes", "study_text", "created"):
        assert key in provenance
    assert provenance["seeds"] == [0] and provenance["dtypes"] == ["bf16"]
    none = frame[frame.speculation == "none"]
    assert (none["speedup"] == 1.0).all()
    # SD pays less as the batch grows (verification turns compute-bound) and as context grows.
    eagle = frame[(frame.method == "eagle") & (frame.k == 4)].set_index(["batch", "context"])["speedup"]
    assert eagle[(1, 4096)] > eagle[(16, 4096)] and eagle[(1, 4096)] > eagle[(1, 32768)]
    # A smaller partial-KV budget diverges more from full verification; so does a longer period.
    pv = frame[(frame.method == "specpv") & (frame.batch == 1) & (frame.context == 32768)]
    pv = pv.set_index(["budget", "period"])["divergence_rate"]
    assert pv[(1024, 16)] > pv[(4096, 16)] > 0 and pv[(1024, 64)] > pv[(1024, 16)]
    # Cost per million tokens follows throughput at the study's price.
    row = frame.iloc[0]
    assert row["cost_per_mtok_usd"] == pytest.approx(2.99 / 3600 / row["throughput_tok_s"] * 1e6)
    html = (out / "report.html").read_text()
    assert html.count("class=\"plotly-graph-div\"") >= 4 and "Recommendations" in html
    assert "<script src" not in html                              # plotly inlined: works offline
    assert "smoke on h100-sxm" in capsys.readouterr().out


def test_results_do_not_depend_on_workers_or_executor_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["sweep", "smoke", "--out", str(a), "--quiet", "--workers", "1"]) == 0
    assert main(["sweep", "smoke", "--out", str(b), "--quiet", "--workers", "2"]) == 0
    pd.testing.assert_frame_equal(sweep_frame(a), sweep_frame(b))


def test_existing_results_need_resume(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "smoke", "--out", str(out), "--quiet"]) == 0
    before = (out / LOG).read_bytes()
    assert main(["sweep", "smoke", "--out", str(out), "--quiet"]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert (out / LOG).read_bytes() == before                      # nothing written over
    assert main(["sweep", "smoke", "--out", str(out), "--quiet", "--resume"]) == 0
    assert (out / LOG).read_bytes() == before                      # every point was finished
    assert main(["sweep", "smoke", "--out", str(out), "--quiet", "--resume", "--overwrite"]) == 2
    assert main(["sweep", "smoke", "--out", str(out), "--quiet", "--overwrite"]) == 0
    assert (out / LOG).read_bytes().count(b"\n") == before.count(b"\n")   # started again, not appended


def test_killed_sweep_resumes_without_losing_or_duplicating_points(tmp_path):
    study = write_study(tmp_path, KILLABLE)
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert main(["sweep", str(study), "--out", str(whole), "--quiet", "--workers", "1"]) == 0
    command = [sys.executable, "-m", "sim", "sweep", str(study), "--out", str(broken), "--quiet", "--workers", "2"]
    process = subprocess.Popen(command, cwd=REPO, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = broken / LOG
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or log.read_bytes().count(b"\n") < 10):
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)                          # the sweep and its workers, mid-run
    process.wait()
    finished = log.read_bytes().count(b"\n")
    assert 10 <= finished < 48 and not (broken / "results.parquet").exists()
    with open(log, "ab") as handle:                                 # and a line torn by the kill
        handle.write(b'{"id": "0123')
    assert main(["sweep", str(study), "--out", str(broken), "--quiet", "--workers", "2", "--resume"]) == 0
    ids = [json.loads(line)["id"] for line in log.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 48                          # none lost, none twice
    pd.testing.assert_frame_equal(sweep_frame(whole), sweep_frame(broken))


def test_ray_executor_on_a_local_ray_instance_matches_local(tmp_path):
    pytest.importorskip("ray")
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert main(["sweep", "smoke", "--out", str(local), "--quiet"]) == 0
    assert main(["sweep", "smoke", "--out", str(on_ray), "--quiet", "--executor", "ray", "--workers", "2"]) == 0
    frame, provenance = read_table(on_ray / "results.parquet")
    assert provenance["executor"] == "ray"
    pd.testing.assert_frame_equal(sweep_frame(local), frame)


@pytest.mark.parametrize("grid, message", [
    ({"workload.concurrency": [1, 0]}, "workload.concurrency=0: input should be greater than 0"),
    ({"speculation.partial_verify.budget": [1024, 1000]},
     "speculation.partial_verify.budget=1000: 1000 is not a multiple of block 16"),
    ({"hardware": ["h100-sxm", "h900"]}, "hardware=\"h900\": unknown preset 'h900'"),
    ({"workload.prompt_tokens": [4096, 200000]}, "workload.prompt_tokens=200000"),
    ({"workload.concurency": [1]}, "workload.concurency=1: unknown field"),
])
def test_bad_grid_value_is_rejected_before_any_point_runs(tmp_path, capsys, grid, message):
    study = {"name": "bad", "base": {"workload": {"requests": 4}},
             "methods": [{"name": "specpv", "set": {"speculation": {
                 "method": "eagle3", "tree": {"tokens": 20, "depth": 4}, "acceptance": {"tokens_per_step": 3},
                 "partial_verify": {"budget": 1024}}}}],
             "grid": {"workload.prompt_tokens": [4096], **grid}}
    out = tmp_path / "out"
    assert main(["sweep", str(write_study(tmp_path, study)), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (out / LOG).exists()


@pytest.mark.parametrize("args, message", [
    (["sweep", "no-such-study.yaml"], "study: cannot read no-such-study.yaml"),
    (["sweep", "smoke", "--workers", "0"], "--workers: must be at least 1"),
    (["sweep", "smoke", "--address", "auto"], "--address: applies to --executor ray"),
    (["report", "nowhere"], "RESULTS: no results table at nowhere"),
    (["sweep", "smoke", "--out", "README.md", "--quiet"], "--out: cannot write to README.md"),
])
def test_bad_sweep_arguments_get_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(REPO)
    before = (REPO / "README.md").read_bytes()
    assert main(args) == 2
    assert (REPO / "README.md").read_bytes() == before
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bad_study_schema_names_the_field(tmp_path, capsys):
    study = write_study(tmp_path, {"name": "x", "groups": [{"name": "g", "methods": [{"name": "a", "sett": {}}]}]})
    assert main(["sweep", str(study), "--out", str(tmp_path / "o")]) == 2
    assert "study.groups.0.methods.0.sett: unknown field" in capsys.readouterr().err


def test_group_requiring_a_missing_bundle_is_skipped_with_a_note(tmp_path, capsys):
    study = {"name": "req", "groups": [
        {"name": "here", "base": {"workload": {"requests": 4, "concurrency": 2}}},
        {"name": "absent", "requires": "no/such/bundle", "base": {"calibration": "no/such/bundle"}}]}
    out = tmp_path / "o"
    assert main(["sweep", str(write_study(tmp_path, study)), "--out", str(out), "--quiet"]) == 0
    assert "group absent skipped: no/such/bundle not found" in capsys.readouterr().err
    assert list(sweep_frame(out)["group"]) == ["here"]


def test_default_study_covers_what_it_promises():
    loaded = load_study(None)
    points = expand_points(loaded)
    frame = pd.DataFrame([{"group": p.group, "method": p.method, "hardware": p.scenario.get("hardware"),
                           "batch": p.scenario["workload"]["concurrency"],
                           "context": p.scenario["workload"]["prompt_tokens"],
                           "budget": p.scenario.get("speculation", {}).get("partial_verify", {}).get("budget"),
                           "period": p.scenario.get("speculation", {}).get("partial_verify", {}).get("period")}
                          for p in points])
    llama = frame[frame.group == "llama-3.1-8b"]
    assert set(llama.hardware) == {"h100-sxm", "h200"}
    assert {"none", "ngram", "eagle", "shadow", "streaming", "specpv"} <= set(llama.method)
    assert llama.batch.min() == 1 and llama.batch.max() == 256
    assert llama.context.min() == 1024 and llama.context.max() == 65536
    assert llama.budget.min() == 512 and llama.budget.max() == 8192
    assert llama.period.min() == 4 and llama.period.max() == 64
    assert (REPO / "calibration/cpu/smollm2-135m").exists() and "smollm2-135m-cpu" in set(frame.group)


def test_report_rebuilds_from_the_table(tmp_path):
    out = tmp_path / "s"
    assert main(["sweep", "smoke", "--out", str(out), "--quiet"]) == 0
    (out / "report.html").unlink()
    validation = REPO / "validation/cpu-default/validation.csv"
    assert main(["report", str(out), "--validation", str(validation)]) == 0
    html = (out / "report.html").read_text()
    assert "Validation: the simulator against live runs" in html


CAPACITY = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
            "workload": {"arrival": "closed", "concurrency": 16, "requests": 120, "prompt_tokens": 1024,
                         "output_tokens": 128},
            "speculation": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}},
            "slo": {"ttft_ms_p90": 500, "tpot_ms_p90": 12}}


def test_capacity_finds_the_highest_rate_meeting_the_slos(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(CAPACITY))
    assert main(["capacity", str(path), "--json", "--tolerance", "0.05"]) == 0
    result = json.loads(capsys.readouterr().out)
    for side in ("speculative", "baseline"):
        r = result[side]
        assert r["rate_qps"] > 0 and not r["at_max_rate"]
        assert r["at_capacity"]["slo_met"]
        failing = [t for t in r["trials"] if t["rate_qps"] == r["first_failing_rate_qps"]]
        assert failing and not failing[0]["slo_met"]
        assert (r["first_failing_rate_qps"] - r["rate_qps"]) / r["first_failing_rate_qps"] <= 0.05
        # every trial below the capacity met the SLOs and every one above missed them
        assert all(t["slo_met"] == (t["rate_qps"] <= r["rate_qps"]) for t in r["trials"])
    assert result["capacity_gain"] == pytest.approx(result["speculative"]["rate_qps"] / result["baseline"]["rate_qps"])
    assert result["capacity_gain"] > 1       # EAGLE at 0.7 meets a tight TPOT at a higher rate


def test_capacity_needs_an_slo(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in CAPACITY.items() if k != "slo"}))
    assert main(["capacity", str(path)]) == 2
    assert "slo: capacity needs slo.ttft_ms_p90 or slo.tpot_ms_p90" in capsys.readouterr().err


def test_reusing_baselines_changes_no_result(tmp_path):
    reuse, fresh = tmp_path / "reuse", tmp_path / "fresh"
    assert main(["sweep", "smoke", "--out", str(reuse), "--quiet", "--workers", "1"]) == 0
    assert main(["sweep", "smoke", "--out", str(fresh), "--quiet", "--workers", "1", "--no-baseline-reuse"]) == 0
    pd.testing.assert_frame_equal(sweep_frame(reuse), sweep_frame(fresh))


def test_study_slo_applies_unless_the_group_sets_its_own(tmp_path):
    study = {"name": "slo", "slo": {"ttft_ms_p90": 100, "tpot_ms_p90": 10}, "groups": [
        {"name": "plain", "base": {"workload": {"requests": 4}}},
        {"name": "own", "base": {"workload": {"requests": 4}, "slo": {"tpot_ms_p90": 99}}}]}
    points = {p.group: p.scenario["slo"] for p in expand_points(load_study(write_study(tmp_path, study)))}
    assert points == {"plain": {"ttft_ms_p90": 100, "tpot_ms_p90": 10}, "own": {"ttft_ms_p90": 100, "tpot_ms_p90": 99}}


def test_a_bad_acceptance_trace_is_caught_before_any_point_runs(tmp_path, capsys):
    (tmp_path / "acc.csv").write_text("something\n1\n")
    study = {"name": "acc", "base": {"workload": {"requests": 4}},
             "methods": [{"name": "eagle", "set": {"speculation": {"method": "eagle",
                                                                   "acceptance": {"trace": "acc.csv"}}}}]}
    out = tmp_path / "out"
    assert main(["sweep", str(write_study(tmp_path, study)), "--out", str(out), "--quiet", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: speculation.acceptance.trace") and err.count("\n") == 1
    assert not (out / LOG).exists()


def test_other_grid_axes_make_their_own_panels(tmp_path):
    """Points that differ in more than speculation and load are never compared in one cell."""
    from sim.sweep.report import recommendations

    study = {"name": "tp", "base": {"workload": {"requests": 16, "concurrency": 8, "output_tokens": 64}},
             "grid": {"tensor_parallel": [1, 2], "workload.prompt_tokens": [1024]},
             "methods": [{"name": "none"},
                         {"name": "eagle", "set": {"speculation": {"method": "eagle", "acceptance": {"rate": 0.7}}}}]}
    out = tmp_path / "o"
    assert main(["sweep", str(write_study(tmp_path, study)), "--out", str(out), "--quiet"]) == 0
    frame = sweep_frame(out)
    assert sorted(frame.panel.unique()) == ["tp on h100-sxm · tensor_parallel=1", "tp on h100-sxm · tensor_parallel=2"]
    rec = recommendations(frame, 0.01)
    eagle = frame[frame.method == "eagle"].set_index("panel")["speedup"]
    for _, row in rec.iterrows():
        assert row["choice"] == "eagle" and row["speedup"] == eagle[row["panel"]]


def test_trace_and_poisson_studies_get_a_report(tmp_path):
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" +
                                        "".join(f"{i * 0.05},{500 + 10 * i},{40 + i}\n" for i in range(20)))
    study = {"name": "mixed", "groups": [
        {"name": "traced", "base": {"workload": {"arrival": "trace", "trace": "trace.csv"}},
         "methods": [{"name": "none"}, {"name": "ngram", "set": {"speculation": {"method": "ngram",
                                                                                 "acceptance": {"rate": 0.4}}}}]},
        {"name": "poisson", "base": {"workload": {"arrival": "poisson", "requests": 30, "prompt_tokens": 800}},
         "grid": {"workload.rate_qps": [2, 8]},
         "methods": [{"name": "none"}, {"name": "eagle", "set": {"speculation": {"method": "eagle",
                                                                                 "acceptance": {"rate": 0.7}}}}]}]}
    out = tmp_path / "o"
    assert main(["sweep", str(write_study(tmp_path, study)), "--out", str(out), "--quiet"]) == 0
    html = (out / "report.html").read_text()
    assert "<h3>traced on h100-sxm</h3>" in html and "<h3>poisson on h100-sxm</h3>" in html
    assert "rate_qps \\ context" in html and "requests \\ context" in html


def test_sigterm_stops_the_sweep_and_its_workers_cleanly(tmp_path):
    study = write_study(tmp_path, KILLABLE)
    out = tmp_path / "o"
    process = subprocess.Popen([sys.executable, "-m", "sim", "sweep", str(study), "--out", str(out), "--quiet",
                                "--workers", "2"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / LOG
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or log.read_bytes().count(b"\n") < 5):
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    if process.returncode == 0:
        pytest.skip("the sweep finished before the signal arrived")
    assert process.returncode == 130 and "finish with --resume" in err and "Traceback" not in err
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout
    assert children == ""                       # no worker left behind


def test_renamed_method_keeps_its_points_on_resume(tmp_path):
    first = dict(KILLABLE, methods=[{"name": "none"}], grid={"workload.prompt_tokens": [512, 1024]})
    path = write_study(tmp_path, first)
    out = tmp_path / "o"
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 0
    lines = (out / LOG).read_bytes()
    renamed = dict(first, methods=[{"name": "autoregressive"}])
    write_study(tmp_path, renamed)
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--resume"]) == 0
    assert (out / LOG).read_bytes() == lines                       # nothing ran again
    assert set(sweep_frame(out)["method"]) == {"autoregressive"}


def test_baseline_only_is_the_baseline_simulate_pairs_with_the_run():
    from sim.simulate import simulate

    scenario = {**CAPACITY, "workload": {**CAPACITY["workload"], "arrival": "poisson", "rate_qps": 50.0}}
    both, alone = simulate(scenario), simulate(scenario, baseline_only=True)
    assert alone.speculative is None and alone.partial_verify is None
    assert alone.run.throughput_tok_s == both.baseline.throughput_tok_s
    assert alone.run.tpot_ms == both.baseline.tpot_ms and alone.run.ttft_ms == both.baseline.ttft_ms


def test_report_writes_each_batch_best_k_as_engine_config(tmp_path):
    """The recommendations as vLLM's per-batch-size schedule: each batch's best static k of the
    method recommended, 0 where no speculation is recommended."""
    from sim.sweep.engine_config import engine_configs
    from sim.sweep.report import recommendations

    study = {"name": "cfg", "base": {"workload": {"output_tokens": 64, "prompt_tokens": 1024}},
             "grid": {"workload": [{"concurrency": 1, "requests": 4}, {"concurrency": 256, "requests": 512}]},
             "methods": [{"name": "none"},
                         {"name": "eagle", "set": {"speculation": {"method": "eagle",
                                                                   "acceptance": {"per_position": [0.8, 0.7, 0.6, 0.5]}}},
                          "grid": {"speculation.num_speculative_tokens": [1, 4]}}]}
    out = tmp_path / "o"
    assert main(["sweep", str(write_study(tmp_path, study)), "--out", str(out), "--quiet"]) == 0
    frame = sweep_frame(out)
    rec = recommendations(frame, 0.01)
    (config,) = engine_configs(frame, rec, 0.01)
    # Batch 1: k = 4 beats k = 1 (1.94x); batch 256: both slow the engine down, none is recommended.
    assert list(rec.sort_values("load").choice) == ["eagle", "none"]
    assert config["schedule"] == [[1, 16, 4], [17, 256, 0]]          # split at sqrt(1 x 256)
    assert config["vllm"] == {"method": "eagle", "model": "DRAFT_MODEL_PATH", "num_speculative_tokens": 4,
                              "num_speculative_tokens_per_batch_size": [[1, 16, 4], [17, 256, 0]]}
    assert config["sglang"][1] == (17, 256, "") and "--speculative-num-steps 4" in config["sglang"][0][2]
    html = (out / "report.html").read_text()
    assert "As engine config" in html and "num_speculative_tokens_per_batch_size" in html
