"""The validation harness: replaying and fitting acceptance, SpecPV disagreement, vLLM counters, and
the smoke campaign end to end on the real SmolLM2."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import QUESTIONS, REPO, TEXT, needs_data
from sim.formats.provenance import repo_relative

pd = pytest.importorskip("pandas")

from sim.acceptance import ReplayAcceptance  # noqa: E402
from sim.validate.fit_acceptance import fit_disagreement, fit_drafter, read_vllm_metrics  # noqa: E402
from sim.errors import InputError  # noqa: E402
from sim.validate.runs import LiveRun  # noqa: E402
from sim.simulate import simulate  # noqa: E402



def synthetic_run(tmp_path, name, accepted_by_request, depth=4, prompt=600, method="ngram", extra=None):
    """A LiveRun built in memory: the steps one request at a time."""
    rows = []
    for rid, accepted in enumerate(accepted_by_request):
        for step, a in enumerate(accepted, 1):
            rows.append({"run": "speculative", "request": rid, "step": step, "mode": "verify", "drafted": depth,
                         "accepted": int(a), "committed": int(a) + 1, "refed": 0, "rolled_back": 0})
    requests = pd.DataFrame({"request": range(len(accepted_by_request)),
                             "prompt_tokens": [prompt] * len(accepted_by_request),
                             "output_tokens": [1 + int(np.sum(a) + len(a)) for a in accepted_by_request]})
    args = {"k": depth, "tree": None, "batch": 1, "method": method, **(extra or {})}
    meta = {"arguments": args, "device": "cpu", "dtype": "float32", "seed": 0}
    return LiveRun(tmp_path / name, meta, {"method": method, "throughput_tok_s": 1.0}, requests, pd.DataFrame(rows))


def test_the_median_repeat_stands_for_a_run(tmp_path):
    from sim.validate.runs import merge_repeats

    def repeat(n, tok_s, **extra):
        run = synthetic_run(tmp_path / str(n), "ngram-c512-b1", [[1, 2]], extra=extra)
        run.summary["throughput_tok_s"] = tok_s
        return run

    three = merge_repeats([repeat(1, 9.0), repeat(2, 12.0), repeat(3, 10.0)])
    assert len(three) == 1 and three[0].path == tmp_path / "3" / "ngram-c512-b1"
    assert three[0].repeat_tok_s == (9.0, 12.0, 10.0)
    two = merge_repeats([repeat(1, 9.0), repeat(2, 12.0)])
    assert two[0].path == tmp_path / "2" / "ngram-c512-b1"         # of two, the faster
    with pytest.raises(InputError, match="different arguments"):
        merge_repeats([repeat(1, 9.0), repeat(2, 9.0, budget=256)])
    # A repeat with the machine probe around it (or one from before the flag) is the same run.
    assert len(merge_repeats([repeat(1, 9.0), repeat(2, 10.0, probe=True), repeat(3, 11.0, probe=False)])) == 1


def test_repeats_of_a_served_run_keep_each_pass_median_latencies(tmp_path):
    from sim.validate.runs import ServerRun, merge_repeats

    def served(n, tok_s, ttft_s, rate=0.2):
        run = synthetic_run(tmp_path / str(n), "ngram-r0.2", [[1, 2], [0, 1]],
                            extra={"serving": "continuous", "rate": rate, "concurrency": None})
        run.summary["throughput_tok_s"] = tok_s
        run.requests["ttft_s"] = ttft_s
        run.requests["tpot_s"] = [0.05, 0.07]
        return run

    merged, = merge_repeats([served(1, 10.0, [0.1, 0.3]), served(2, 11.0, [0.2, 0.4])])
    assert merged.open_loop
    assert merged.repeat_ttft_p50_ms == pytest.approx((200.0, 300.0)) and merged.repeat_tpot_p50_ms == pytest.approx((60.0, 60.0))
    # A server's runs are merged by the same rule, without the live engine's latency fields.
    server = ServerRun(tmp_path / "s" / "ngram-b4", {"arguments": {"batch": 4}}, {"throughput_tok_s": 5.0}, pd.DataFrame())
    assert merge_repeats([server])[0].repeat_tok_s == (5.0,)


def test_repeats_give_the_measurements_own_error_beside_the_predictions():
    from sim.validate.aggregate import aggregate, leave_one_out
    from sim.validate.compare import Comparison

    assert leave_one_out((10.0, 11.0, 12.0)) == pytest.approx([abs(10 / 11.5 - 1), 0.0, abs(12 / 10.5 - 1)])

    def row(run, prediction, tok_s=(), speedup=()):
        return Comparison(run, "ngram", "ngram k=4", 1, 512.0, 2, prediction, 10.0, 10.5, 0.9, 0.95, None, None,
                          60.0, 58.0, 1.5, 1.5, repeats=len(tok_s) or 1, repeat_tok_s=tok_s, repeat_speedup=speedup)

    rows = [row("a", "replay", (10.0, 11.0, 12.0), (0.8, 0.9, 1.0)), row("a", "fitted", (10.0, 11.0, 12.0), (0.8, 0.9, 1.0)),
            row("b", "replay", (10.0, 10.0)), row("c", "replay")]
    repeats = {a["metric"]: a for a in aggregate(rows) if a["prediction"] == "repeats"}
    # One run counted once (not per prediction); runs of fewer than three repeats left out.
    assert repeats["tok_s"]["runs"] == 1 and repeats["speedup"]["runs"] == 1
    assert repeats["tok_s"]["worst"] == pytest.approx(12 / 10.5 - 1)
    assert repeats["speedup"]["median"] == pytest.approx(abs(0.8 / 0.95 - 1))
    assert "repeat_tok_s" not in rows[0].row()                     # not a CSV column
    assert not [a for a in aggregate([row("c", "replay")]) if a["prediction"] == "repeats"]


def test_served_latencies_are_summarized_over_open_loop_runs_with_their_repeats_floor():
    from sim.validate.aggregate import aggregate
    from sim.validate.compare import Comparison

    def row(run, open_loop, ttft_ms, repeats):
        return Comparison(run, "ngram", "ngram k=4", 8, 177.0, 26, "replay", 10.0, 10.0, 1.0, 1.0, None, None,
                          60.0, 60.0, 1.5, 1.5, measured_ttft_p50_ms=ttft_ms, predicted_ttft_p50_ms=110.0,
                          measured_tpot_p50_ms=50.0, predicted_tpot_p50_ms=50.0, open_loop=open_loop,
                          repeat_ttft_p50_ms=repeats, repeat_tpot_p50_ms=(50.0, 50.0))

    # A closed loop's TTFT (its queue) is left out of the summary; two repeats give a floor.
    rows = [row("poisson", True, 100.0, (100.0, 125.0)), row("closed", False, 1000.0, (1000.0, 2000.0))]
    summary = {(a["prediction"], a["metric"]): a for a in aggregate(rows)}
    assert summary[("replay", "ttft_p50_ms")]["runs"] == 1
    assert summary[("replay", "ttft_p50_ms")]["median"] == pytest.approx(0.1)
    floor = summary[("repeats", "ttft_p50_ms")]
    assert floor["runs"] == 1 and floor["worst"] == pytest.approx(0.25) and floor["median"] == pytest.approx((0.25 + 0.2) / 2)
    assert summary[("repeats", "tpot_p50_ms")]["median"] == 0.0
    assert ("repeats", "tok_s") not in summary                      # throughput's floor takes three repeats


def geometric(rng, rate, depth, steps):
    u = rng.random(steps)
    return np.minimum(np.floor(np.log(u) / np.log(rate)), depth).astype(int)


def test_fitted_rates_recover_a_geometric_drafter(tmp_path):
    rng = np.random.default_rng(0)
    run = synthetic_run(tmp_path, "g", [geometric(rng, 0.6, 4, 3000) for _ in range(4)])
    fit = fit_drafter([run])["acceptance"]
    assert fit["per_position"] == pytest.approx([0.6] * 4, abs=0.04)
    assert fit["request_spread"] < 0.03            # every request has the same rate
    assert fit["context_slope"] == 0.0              # no request beyond 1,024 tokens


def test_acceptance_is_fitted_on_full_verification_runs_where_there_are_any(tmp_path):
    from sim.validate.fit_acceptance import acceptance_runs, fit_drafters

    rng = np.random.default_rng(0)
    plain = synthetic_run(tmp_path, "plain", [geometric(rng, 0.6, 4, 2000)])
    # A SpecPV run of the same drafter accepts less: partial attention disagrees with full.
    partial = synthetic_run(tmp_path, "partial", [geometric(rng, 0.3, 4, 2000)], extra={"budget": 256})
    assert acceptance_runs([plain, partial]) == [plain] and acceptance_runs([partial]) == [partial]
    (fit,) = fit_drafters([plain, partial]).values()          # one drafter
    assert fit["acceptance"]["per_position"] == pytest.approx([0.6] * 4, abs=0.05)


def test_request_spread_and_context_slope_are_seen(tmp_path):
    rng = np.random.default_rng(1)
    mixed = synthetic_run(tmp_path, "m", [geometric(rng, r, 4, 2000) for r in (0.3, 0.5, 0.7, 0.9)])
    assert fit_drafter([mixed])["acceptance"]["request_spread"] > 0.1
    short = synthetic_run(tmp_path, "s", [geometric(rng, 0.7, 4, 2000) for _ in range(3)], prompt=1000)
    long = synthetic_run(tmp_path, "l", [geometric(rng, 0.5, 4, 2000) for _ in range(3)], prompt=4096)
    slope = fit_drafter([short, long])["acceptance"]["context_slope"]
    assert -0.14 < slope < -0.07                    # 0.2 lower after two doublings


def test_disagreement_fit_recovers_the_rate_and_its_budget_exponent():
    rng = np.random.default_rng(2)
    observations = []
    for budget in (256, 1024):
        p = 0.02 * (256 / budget)                   # exponent 1 in the budget
        trials = failures = 0
        for _ in range(3000):                       # buffers of 16 tokens, stopped at a failure
            first = rng.geometric(p) - 1
            if first < 16:
                trials, failures = trials + first + 1, failures + 1
            else:
                trials += 16
        observations.append({"budget": budget, "context": 2048, "trials": trials, "failures": failures})
    fit = fit_disagreement(observations)
    p256 = fit["per_token"] * (fit["at_budget"] / 256) ** fit["budget_exponent"]
    assert p256 == pytest.approx(0.02, rel=0.2)
    assert fit["budget_exponent"] == pytest.approx(1.0, abs=0.3)
    assert fit["context_exponent"] == 0.5           # one context: not fitted, the default kept


def test_vllm_prometheus_counters_give_per_position_rates(tmp_path):
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 1000.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 800.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 600.0\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 300.0\n')
    fit = read_vllm_metrics(scrape)
    assert fit["acceptance"]["per_position"] == pytest.approx([0.8, 0.75, 0.5])
    assert fit["tokens_per_step"] == pytest.approx(1 + 1700 / 1000)
    per_request = tmp_path / "requests.jsonl"
    per_request.write_text("".join(json.dumps({"num_drafts": 100, "num_accepted_tokens_per_pos": pos}) + "\n"
                                   for pos in ([90, 80, 70], [30, 10, 5])))
    assert read_vllm_metrics(per_request)["acceptance"]["request_spread"] > 0.2
    out = tmp_path / "acceptance.yaml"
    proc = subprocess.run([sys.executable, "-m", "sim", "fit-acceptance", "--vllm", scrape, "-o", out], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    block = yaml.safe_load(out.read_text())["drafters"]["vllm metrics.txt"]["acceptance"]
    scenario = {"speculation": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": block}}
    assert simulate(scenario).run.tokens_per_step > 1.0


REPLAY_SCENARIO = {"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32",
                   "scheduler": {"max_batch": 2, "prefill_chunk": 128},
                   "speculation": {"method": "ngram", "num_speculative_tokens": 4,
                                   "acceptance": {"tokens_per_step": 2.0}}}


def replay_scenario(outputs, prompt=64, **speculation):
    return {**REPLAY_SCENARIO, "workload": {"arrival": "closed", "concurrency": len(outputs), "requests": len(outputs),
                                            "prompt_tokens": prompt, "output_tokens": outputs},
            "speculation": {**REPLAY_SCENARIO["speculation"], **speculation}}


def test_replay_commits_exactly_the_recorded_tokens_in_order():
    recorded = [np.array([4, 0, 2, 3, 1, 4]), np.array([1, 1, 0, 4, 4, 2])]
    # Outputs end inside the sequences: the first token comes from the prefill, then steps
    # commit 5, 1, 3, 4 (request 0) and 2, 2, 1, 5 (request 1).
    result = simulate(replay_scenario([1 + 13, 1 + 10]),
                      acceptance=lambda config, n, rng: ReplayAcceptance(recorded, 4))
    assert result.run.tokens_per_step_histogram == {1: 2, 2: 2, 3: 1, 4: 1, 5: 2}
    assert result.run.iterations == 1 + 4            # the prefill, then four verification steps


def test_replay_indexes_roll_backs_and_proposal_lengths_by_step():
    model = ReplayAcceptance([np.array([1, 2, 3])], 4, rolled_back=[np.array([0, 5, 7])],
                             drafted=[np.array([4, 0, 2])])
    rids, steps = np.array([0, 0, 0, 0]), np.array([0, 1, 2, 3])
    assert model.rolled_back(rids, steps).tolist() == [0, 5, 7, 0]       # cyclic past the end
    assert model.verify_tokens(rids, steps).tolist() == [5, 1, 3, 5]
    assert ReplayAcceptance([np.array([1])], 4).verify_tokens is None     # full proposals: no override
    # A replay whose drafter proposed nothing verifies one token a step: cheaper steps.
    accepted = [np.zeros(30, np.int64)]
    full = simulate(replay_scenario([31]), acceptance=lambda c, n, rng: ReplayAcceptance(accepted, 4))
    short = simulate(replay_scenario([31]), acceptance=lambda c, n, rng: ReplayAcceptance(
        accepted, 4, drafted=[np.zeros(30, np.int64)]))
    assert short.run.makespan_s < full.run.makespan_s


def test_replayed_rectify_rolls_back_what_was_recorded():
    accepted = [np.full(200, 2)]
    rolled = [np.ones(200, np.int64)]          # every full verification discards one token
    scenario = replay_scenario([80], prompt=2000, partial_verify={"budget": 256, "period": 2, "period_unit": "steps",
                                                                  "rectify": True})
    result = simulate(scenario, acceptance=lambda c, n, rng: ReplayAcceptance(accepted, 4, rolled_back=rolled))
    pv = result.partial_verify
    # The first full verification has nothing to re-check; each later one rolls back one token.
    assert pv["rolled_back_tokens"] == pv["full_verifications"] - 1 > 0
    assert pv["divergent_tokens"] == 0.0


def test_rectify_rechecks_partial_tokens_before_a_request_ends():
    scenario = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
                "workload": {"arrival": "closed", "concurrency": 4, "requests": 8, "prompt_tokens": 8192,
                             "output_tokens": 200},
                "speculation": {"method": "ngram", "num_speculative_tokens": 4, "acceptance": {"rate": 0.7},
                                "partial_verify": {"budget": 1024, "period": 64, "rectify": True,
                                                   "disagreement": {"per_token": 0.01}}}}
    result = simulate(scenario)
    assert result.partial_verify["divergent_tokens"] == 0.0    # nothing left unchecked at the end
    assert result.partial_verify["rolled_back_tokens"] > 0


def test_quest_selection_every_step_costs_more_than_at_refresh():
    def selection_share(reselect):
        scenario = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
                    "workload": {"arrival": "closed", "concurrency": 4, "requests": 8, "prompt_tokens": 16384,
                                 "output_tokens": 128},
                    "speculation": {"method": "ngram", "num_speculative_tokens": 4, "acceptance": {"rate": 0.7},
                                    "partial_verify": {"budget": 1024, "period": 32, "reselect": reselect}}}
        return simulate(scenario).run.phase_s["selection"]
    assert selection_share("step") > 2 * selection_share("refresh")


def validate(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "sim", "validate", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)


def campaign(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "profiler", "campaign", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)


def test_validate_rejects_bad_input_in_one_line(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "campaign.json").write_text('{"campaign": "x", "runs": ["gone"]}')
    for args, needle in (([tmp_path], "is not a profiler live run"),
                         ([], "RUN_DIR: give run or campaign folders, or --published [CATALOGUE]"),
                         ([tmp_path / "broken"], "gone is missing (finish the campaign"),
                         ([tmp_path, "--docs", tmp_path / "x.md"], "--docs: names its table after the --out folder")):
        proc = validate(*args)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_campaign_rejects_bad_input_in_one_line(tmp_path):
    bad_field = tmp_path / "bad.yaml"
    bad_field.write_text("runs:\n  - {name: a, method: none, batchh: 2}\n")
    bad_value = tmp_path / "value.yaml"
    bad_value.write_text("runs:\n  - {name: a, method: medusa}\n")
    for args, needle in ((["nosuch", "--out", tmp_path / "o"], "no campaign named nosuch"),
                         ([bad_field, "--out", tmp_path / "o"], "CAMPAIGN: run a: batchh: Extra inputs"),
                         ([bad_value, "--out", tmp_path / "o"], "CAMPAIGN: run a: method: Input should be"),
                         (["smoke", "--out", tmp_path / "o"], "--text: run none-c256-b2 builds 256-token prompts"),
                         (["smoke", "--out", tmp_path / "o", "--repeats", "0"], "--repeats: must be >= 1"),
                         (["chat-serving", "--out", tmp_path / "o"], "--prompts: run none-b4 takes its chat prompts by path")):
        proc = campaign(*args)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert not (tmp_path / "o").exists()


def test_every_committed_campaign_plans_cleanly(tmp_path):
    """Each campaign in profiler/campaigns passes the checks its runs get before any starts (fields,
    values, and the files it names, the EAGLE head's folder among them), given --text and --prompts."""
    pytest.importorskip("pydantic")
    from profiler.campaign import CampaignConfig, campaign_names, plan_runs, read_campaign

    for name in campaign_names():
        campaign = read_campaign(name)
        planned = plan_runs(campaign, CampaignConfig(campaign=name, out=tmp_path / name, text=TEXT,
                                                     prompts=QUESTIONS), 2)
        assert len(planned) == 2 * len(campaign["runs"]), name
        for _, _, settings in planned:
            if settings.head is not None:
                assert (REPO / settings.head / "head.json").is_file(), (name, settings.head)


@needs_data
def test_smoke_campaign_end_to_end_replays_and_fits(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("plotly")
    out = tmp_path / "smoke"
    docs = tmp_path / "validation.md"
    docs.write_text("before\n<!-- validation:smoke:begin -->\nold\n<!-- validation:smoke:end -->\nafter\n")
    proc = campaign("smoke", "--text", TEXT, "--out", out, "--probe")
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / "campaign.json").read_text())
    assert record["campaign"] == "smoke" and record["runs"] == ["none-c256-b2", "ngram-c256-b2"]
    assert record["file"] == "profiler/campaigns/smoke.yaml" and set(record["wall_s"]) == set(record["runs"])
    arguments = json.loads((out / "none-c256-b2" / "meta.json").read_text())["arguments"]
    # Paths relative to the repository; long-context prompts come from the text, not a prompts file.
    assert arguments["prompts"] is None and arguments["text"] == repo_relative(TEXT)
    assert not arguments["out"].startswith("/") and arguments["out"].endswith("smoke/none-c256-b2")
    # The campaign's own bundle prices it: no --calibration needed.
    proc = validate(out, "--out", out, "--docs", docs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "none-c256-b2" / "steps.parquet").exists() and (out / "ngram-c256-b2" / "steps.parquet").exists()
    first_line = (out / "validation.csv").read_text().splitlines()[0]
    assert first_line.startswith("# provenance: ") and "git_revision" in first_line
    rows = pd.read_csv(out / "validation.csv", comment="#")
    replay = rows[rows.prediction == "replay"].iloc[0]
    # Replay commits the recorded tokens step by step: tokens per step is reproduced exactly.
    assert replay.predicted_tokens_per_step == pytest.approx(replay.measured_tokens_per_step)
    assert math.isfinite(replay.predicted_speedup) and replay.measured_speedup > 0
    # One ngram run: nothing to fit on. --probe timed the machine around each run: every prediction
    # again at the measured speed, against the committed bundle's own probe.
    assert set(rows.prediction) == {"cost model", "replay", "cost model @ probe", "replay @ probe"}
    assert all(json.loads((out / name / "meta.json").read_text())["machine_probe"]["after"]["decode_s"] > 0
               for name in ("none-c256-b2", "ngram-c256-b2"))
    # Against the bundle's own probe, not its price of the probe forwards.
    assert not rows.note.dropna().astype(str).str.contains("price of the probe").any()
    html = (out / "parity.html").read_text()
    # plotly.js inlined (about 4 MB), no script fetched from the network: works offline.
    assert len(html) > 1_000_000 and not re.search(r"<script[^>]+src=", html)
    text = docs.read_text()
    assert text.startswith("before\n<!-- validation:smoke:begin -->\nReproduce: `python -m sim validate ")
    assert "--calibration calibration/cpu/smollm2-135m --out " in text.splitlines()[2]
    assert "| none-c256-b2 |" in text and text.endswith("<!-- validation:smoke:end -->\nafter\n")
    assert "error at the probe's speed" in text
    # Resuming runs nothing again.
    again = campaign("smoke", "--text", TEXT, "--out", out)
    assert again.returncode == 0 and "2 runs already there, 0 run" in again.stdout

    fitted = tmp_path / "acceptance.yaml"
    proc = subprocess.run([sys.executable, "-m", "sim", "fit-acceptance", out / "none-c256-b2",
                           out / "ngram-c256-b2", "-o", fitted], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    document = yaml.safe_load(fitted.read_text())
    block = document["drafters"]["ngram k=4"]["acceptance"]
    scenario = {"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32",
                "speculation": {"method": "ngram", "num_speculative_tokens": 4, "acceptance": block}}
    assert simulate(scenario).run.tokens_per_step > 1.0           # the fitted block is a valid scenario block

    # The oracle bounds: prompt lookup's acceptance at every position of the greedy output, whose
    # walk at k = 4 gives back every step the run recorded, then the what-ifs priced.
    positions = tmp_path / "positions.parquet"
    proc = subprocess.run([sys.executable, "-m", "profiler", "positions", out, "--out", positions], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ngram-c256-b2: " in proc.stdout and "its own steps replayed 100.0%" in proc.stdout
    table = pd.read_parquet(positions)
    assert set(table.run) == {"ngram-c256-b2"} and table.accepted.between(0, 8).all()
    # The matched n-gram's length (0: none); a 256-token prompt matches some token nearly everywhere.
    assert table.lookup_match.between(0, 3).all() and (table.lookup_match > 0).mean() > 0.5
    oracle_docs = tmp_path / "oracle.md"
    oracle_docs.write_text("<!-- validation:oracle:begin -->\n<!-- validation:oracle:end -->\n")
    proc = subprocess.run([sys.executable, "-m", "sim", "oracle", positions, out, "--docs", oracle_docs], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, row = proc.stdout.splitlines()[:2]
    values = dict(zip(header.split()[3:], row.split()[3:]))
    # The walk is the run's own steps: the same prediction as replaying them.
    assert float(values["static"]) == pytest.approx(float(values["replay"]), rel=1e-6)
    assert float(values["oracle"]) >= float(values["static"])
    assert "Reproduce: `python -m sim oracle " in oracle_docs.read_text()


def test_static_shape_padding_makes_mixed_specpv_steps_cost_more():
    def makespan(pad):
        scenario = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
                    "workload": {"arrival": "closed", "concurrency": 8, "requests": 16, "prompt_tokens": 8192,
                                 "output_tokens": 256},
                    "scheduler": {"pad_ragged": pad},
                    "speculation": {"method": "ngram", "num_speculative_tokens": 4, "acceptance": {"rate": 0.7},
                                    "partial_verify": {"budget": 1024, "period": 24}}}
        return simulate(scenario).run.makespan_s
    assert makespan(True) > makespan(False) * 1.01


def test_draft_share_drafts_that_share_of_steps_and_commits_one_token_at_the_others():
    from sim.acceptance import ConstantAcceptance, DraftShareAcceptance

    model = DraftShareAcceptance(ConstantAcceptance(5.0, 4), 0.3, seed=7)
    rids = np.repeat(np.arange(50), 200)
    steps = np.tile(np.arange(200), 50)
    drafted = model.drafts(rids, steps)
    assert abs(drafted.mean() - 0.3) < 0.02
    tokens, total = model.draw(len(rids), rids, steps, None)
    # Where it drafts, every draft is accepted (5 tokens); elsewhere one token, verified alone.
    assert set(tokens[drafted]) == {5} and set(tokens[~drafted]) == {1} and total == tokens.sum()
    assert model.verify_tokens(rids, steps).tolist() == np.where(drafted, 5, 1).tolist()
    # The same (request, step) always drafts or not: pricing and drawing agree.
    assert (model.drafts(rids, steps) == drafted).all()


def test_a_drafted_share_below_one_commits_and_costs_less_in_a_flattening_engine():
    scenario = {**replay_scenario([65, 65]), "scheduler": {"max_batch": 2, "prefill_chunk": 128, "pad_ragged": False}}
    scenario["speculation"] = {"method": "ngram", "num_speculative_tokens": 4,
                               "acceptance": {"per_position": [0.9, 0.9, 0.9, 0.9]}}
    every = simulate(scenario)
    scenario["speculation"]["acceptance"]["draft_share"] = 0.25
    some = simulate(scenario)
    tps = lambda r: sum(k * c for k, c in r.run.tokens_per_step_histogram.items()) / sum(r.run.tokens_per_step_histogram.values())
    expected = 1 + 0.25 * sum(np.cumprod([0.9] * 4))
    assert abs(tps(some) - expected) < 0.25 and tps(every) > 3.5
    # Padded (a static-shape engine) a step verifies the longest row: slower than ragged.
    padded = simulate({**scenario, "scheduler": {**scenario["scheduler"], "pad_ragged": True}})
    assert padded.run.tokens_per_step_histogram == some.run.tokens_per_step_histogram
    assert padded.run.makespan_s > some.run.makespan_s
    with pytest.raises(InputError, match="draft_share"):
        from sim.scenario.load import load_scenario
        load_scenario({**scenario, "speculation": {**scenario["speculation"],
                                                   "acceptance": {"trace": "x.csv", "draft_share": 0.5}}})


def server_run(tmp_path, name, method="ngram", k=4, drafts=0.0, per_position=(), batch=2, tok_s=10.0, outputs=(9, 9)):
    from sim.validate.runs import ServerRun

    requests = pd.DataFrame({"request": range(len(outputs)), "prompt_tokens": [100] * len(outputs),
                             "output_tokens": list(outputs), "sent_s": [0.0] * len(outputs)})
    args = {"k": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "batch": batch, "rate": None, "limit": len(outputs)}
    spec = {"drafts": drafts, "accepted": float(sum(per_position)), "accepted_per_position": list(per_position)}
    summary = {"method": method, "throughput_tok_s": tok_s, "ttft_p50_ms": 50.0, "tpot_p50_ms": 30.0,
               "spec_decode": spec if method != "none" else None}
    meta = {"arguments": args, "engine": "vllm", "dtype": "float32", "seed": 0}
    return ServerRun(tmp_path / name, meta, summary, requests)


def test_server_acceptance_is_the_counters_conditional_rates_and_drafted_share(tmp_path):
    from sim.validate.server import server_acceptance

    # 16 decode tokens, 6 accepted: 10 request-steps, 4 of them drafted; positions accepted 3, 2, 1, 0.
    run = server_run(tmp_path, "a", drafts=4.0, per_position=(3.0, 2.0, 1.0, 0.0))
    assert run.decode_steps == 10
    block = server_acceptance([run])
    assert block["draft_share"] == 0.4
    assert block["per_position"] == [0.75, round(2 / 3, 4), 0.5, 0.0]
    # Pooled: the counters summed before the rates are taken.
    other = server_run(tmp_path, "b", drafts=6.0, per_position=(6.0, 6.0, 6.0, 6.0), outputs=(17, 17))
    pooled = server_acceptance([run, other])
    assert pooled["per_position"][0] == 0.9 and pooled["draft_share"] == round(10 / (10 + 8), 4)
    assert server_acceptance([server_run(tmp_path, "c", drafts=0.0)]) is None


def test_a_folder_of_run_folders_expands_to_them_by_name(tmp_path):
    from sim.formats.campaign import expand_run_folders

    for name in ("none-c512-b2", "none-c512-b1"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "meta.json").write_text("{}")
    (tmp_path / "runs" / "notes").mkdir()
    assert expand_run_folders([tmp_path / "runs"]) == [tmp_path / "runs" / "none-c512-b1",
                                                       tmp_path / "runs" / "none-c512-b2"]
    # A run folder, or a folder that holds none, stays as given (reading it then says what is wrong).
    assert expand_run_folders([tmp_path / "runs" / "none-c512-b1"]) == [tmp_path / "runs" / "none-c512-b1"]
    assert expand_run_folders([tmp_path / "runs" / "notes"]) == [tmp_path / "runs" / "notes"]


def test_same_work_spread_compares_the_batch_1_servers_of_one_setting():
    import pandas as pd

    from sim.validate.runs import ServerRun
    from sim.validate.server import same_work_spread

    def run(name, batch, ttft, context=512):
        args = {"batch": batch, "rate": None, "context": context, "k": 2}
        requests = pd.DataFrame({"request": range(len(ttft)), "ttft_s": ttft})
        return ServerRun(Path(name), {"arguments": args}, {"method": "ngram"}, requests)

    runs = [run("a", 1, [1.0, 1.0]), run("b", 1, [1.1, 1.1]), run("c", 1, [0.9, 1.3]),
            run("d", 2, [5.0, 5.0]),                          # another load: not the same work
            run("e", 1, [3.0, 3.0], context=2048)]             # alone in its setting: nothing to compare
    spread = same_work_spread(runs)
    # Pairs a-b (2.0 vs 2.2), a-c (2.0 vs 2.2), b-c (2.2 vs 2.2).
    assert spread["pairs"] == 3 and spread["median"] == pytest.approx(0.1)
    assert same_work_spread([runs[0], runs[3], runs[4]]) is None


def test_bracket_spread_compares_a_settings_two_baselines_at_every_load():
    import pandas as pd

    from sim.validate.runs import ServerRun
    from sim.validate.server import bracket_spread, same_work_line, same_work_spread

    def run(name, method, batch, tok_s, after=False):
        args = {"batch": batch, "rate": None, "context": 512, "k": 2, "after": after}
        requests = pd.DataFrame({"request": [0, 1], "ttft_s": [1.0, 1.0]})
        return ServerRun(Path(name), {"arguments": args}, {"method": method, "throughput_tok_s": tok_s}, requests)

    runs = [run("none-b4", "none", 4, 50.0), run("ngram-k2-b4", "ngram", 4, 60.0), run("none-after-b4", "none", 4, 55.0, after=True),
            run("none-b8", "none", 8, 80.0), run("none-after-b8", "none", 8, 72.0, after=True),
            run("none-b16", "none", 16, 90.0),                 # no second baseline: not a bracket
            run("none-b2", "none", 2, 30.0), run("none-b2-rerun", "none", 2, 20.0)]   # two studies, no bracket
    bracket = bracket_spread(runs)
    assert bracket["settings"] == 2 and bracket["median"] == pytest.approx((0.1 + 80 / 72 - 1) / 2)
    # No batch-1 pairs: the bracket alone makes the floor's line.
    spread = same_work_spread(runs)
    assert "median" not in spread and "two baselines" in same_work_line(spread)
    assert bracket_spread(runs[:2]) is None
