"""Calibration bundles: the interpolation tables, reading and checking bundles, the calibrated cost
model in the simulator, and `python -m profiler calibrate` / `inspect` end to end on a small model."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.calibrate.rounds import evenly_spaced_positions
from profiler.calibrate.fits import DECODE_BURSTS_WITHIN_ROUND, DECODE_TOKENS
from sim.formats.bundle import HELD_OUT_TARGET, expected_range, load_bundle, model_hash, round_spread, rounds_note
from sim.formats.table import OperatorTable
from sim.errors import InputError
from sim.formats.provenance import repo_relative
from sim.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "calibration" / "cpu" / "smollm2-135m"


def smollm2_scenario(**fields) -> dict:
    base = {"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32", "calibration": str(BUNDLE),
            "workload": {"concurrency": 4, "requests": 8, "prompt_tokens": 200, "output_tokens": 32}}
    base.update(fields)
    return base


def pricing_warnings(result) -> list[str]:
    """A result's warnings less its bundle's own (tables above the held-out target, which the
    committed bundle of a noisy VM is: docs/validation.md)."""
    return [w for w in result.provenance["warnings"] if " holds out within a median " not in w]


# ---- tables -------------------------------------------------------------------------------------

def test_table_is_exact_at_grid_points_and_on_power_laws():
    tokens = np.array([1.0, 4.0, 16.0, 64.0])
    table = OperatorTable("t", ("tokens",), [tokens], 1e-3 * tokens ** 0.5)
    for x in tokens:
        assert table(x) == pytest.approx(1e-3 * x ** 0.5, rel=1e-12)
    # Log-log interpolation reproduces a power law between grid points exactly.
    assert table(8.0) == pytest.approx(1e-3 * 8 ** 0.5, rel=1e-12)


def test_table_extrapolation_is_flat_below_and_linear_above():
    table = OperatorTable("t", ("tokens",), [np.array([2.0, 8.0])], np.array([1.0, 2.0]))
    assert table(1.0) == pytest.approx(1.0)
    assert table(16.0) == pytest.approx(4.0)        # 2.0 x 16 / 8
    square = OperatorTable("t", ("tokens",), [np.array([2.0, 8.0])], np.array([1.0, 2.0]), power_above=2.0)
    assert square(16.0) == pytest.approx(8.0)       # 2.0 x (16 / 8)^2
    held = OperatorTable("t", ("tokens",), [np.array([2.0, 8.0])], np.array([1.0, 2.0]), power_above=0.0)
    assert held(16.0) == pytest.approx(2.0)
    grid = OperatorTable("a", ("batch", "kv"), [np.array([1.0, 4.0]), np.array([10.0, 100.0])],
                         np.array([[1.0, 3.0], [2.0, 9.0]]))
    assert grid(8.0, 200.0) == pytest.approx(9.0 * 2 * 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-6, 1.0), min_size=4, max_size=4), st.floats(1.0, 4.0), st.floats(10.0, 100.0))
def test_table_stays_within_its_neighbours(values, batch, kv):
    """Multilinear in log space never leaves the range of the surrounding measurements."""
    grid = OperatorTable("a", ("batch", "kv"), [np.array([1.0, 4.0]), np.array([10.0, 100.0])],
                         np.array(values).reshape(2, 2))
    assert min(values) * (1 - 1e-9) <= grid(batch, kv) <= max(values) * (1 + 1e-9)


def test_table_rejects_missing_values():
    with pytest.raises(ValueError, match="missing"):
        OperatorTable("t", ("tokens",), [np.array([1.0, 2.0])], np.array([1.0, np.nan]))


# ---- the committed bundle -------------------------------------------------------------------------

def test_committed_bundle_reads_and_reports_its_error():
    bundle = load_bundle(BUNDLE)
    meta = bundle.meta
    assert meta["model"]["name"] == "smollm2-135m" and meta["dtype"] == "fp32"
    assert meta["device"]["hardware"] == "cpu"
    for key in ("torch", "python"):
        assert meta["versions"][key]
    assert meta["git_revision"] and meta["date"]
    held = meta["held_out"]
    assert held["points"] > 100 and 0 <= held["median_abs_error"] <= held["p90_abs_error"] <= held["max_abs_error"]
    assert set(held["per_operator"]) == set(meta["grid"]) and len(held["forward_checks"]) >= 5
    for op in ("linear.qkv", "linear.o", "linear.gate_up", "linear.down", "elementwise", "attention",
               "attention_prefill", "attention_prompt", "lm_head", "forward_base", "accept", "ngram", "summaries", "selection",
               "int8.qkv", "int4.down"):
        assert bundle.table(op) is not None, op


def test_calibrated_prediction_differs_from_roofline_and_is_deterministic():
    calibrated = simulate(smollm2_scenario())
    again = simulate(smollm2_scenario())
    roofline = simulate(smollm2_scenario(calibration=None))
    assert calibrated.baseline.throughput_tok_s == again.baseline.throughput_tok_s
    assert calibrated.baseline.throughput_tok_s != pytest.approx(roofline.baseline.throughput_tok_s, rel=0.01)
    provenance = calibrated.provenance
    assert provenance["cost_model"].startswith("calibrated:")
    # The committed bundle's one possible warning: its tables above the held-out target.
    held = load_bundle(BUNDLE).meta["held_out"]["median_abs_error"]
    assert provenance["calibration"]["device"]
    assert [w.split(" holds out")[0] for w in provenance["warnings"]] == \
        (["calibration calibration/cpu/smollm2-135m"] if held > HELD_OUT_TARGET else [])


def test_calibrated_costs_grow_with_batch_and_context():
    from sim.cost.batch import DECODE, PHASES, uniform_group
    from sim.cost.model import cost_model_for
    from sim.cost.stack import build_stacks
    from sim.scenario.load import load_scenario

    scenario = load_scenario(smollm2_scenario())
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    shares = [0.0] * len(PHASES)
    at = lambda n, kv: cost.forward(target, [uniform_group(DECODE, n, 1, n * kv)], shares)
    assert at(1, 256) < at(1, 4096) < at(8, 4096)
    assert at(8, 256) < at(8, 4096)
    # Past the grid's largest KV the attention term keeps growing (linear extrapolation).
    assert at(1, 16384) > at(1, 8192)


def test_calibrated_speculative_methods_price_their_drafts():
    for method, extra in (("ngram", {}), ("shadow", {"bits": 8}), ("layerskip", {"exit_layer": 10}),
                          ("streaming", {"kv_budget": 256})):
        spec = {"method": method, "num_speculative_tokens": 4, "acceptance": {"rate": 0.6}}
        if extra:
            spec["draft"] = extra
        result = simulate(smollm2_scenario(speculation=spec))
        assert result.run.time_share.get("draft", 0) > 0, method
        assert pricing_warnings(result) == [], method


def test_stack_without_tables_falls_back_to_roofline_with_a_warning():
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "acceptance": {"rate": 0.6},
            "draft": {"model": "smollm2-135m"}}
    result = simulate(smollm2_scenario(speculation=spec, model="smollm2-135m"))
    assert pricing_warnings(result) == []        # same dims: the draft reads the same tables
    spec["method"] = "eagle3"
    spec["draft"] = {"layers": 1}
    result = simulate(smollm2_scenario(speculation=spec))
    assert any("roofline" in w for w in result.provenance["warnings"]), result.provenance["warnings"]


# ---- checks ---------------------------------------------------------------------------------------

def copy_bundle(tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(BUNDLE, target)
    return target


def with_selection_factor(tmp_path: Path, factor) -> Path:
    """A copy of the committed bundle with this selection factor over batch 1, 4 x context 512,
    2,048 (None: without one)."""
    bundle = copy_bundle(tmp_path)
    meta = json.loads((bundle / "meta.json").read_text())
    meta["fits"].pop("selection_factor", None)
    if factor is not None:
        meta["fits"]["selection_factor"] = {"batch": [1, 4], "context": [512, 2048], "budgets": [256, 1024],
                                            "factor": factor}
    (bundle / "meta.json").write_text(json.dumps(meta))
    return bundle


def test_forward_factor_is_the_measured_ratios_interpolated_between_their_shapes(tmp_path):
    bundle = copy_bundle(tmp_path)
    meta = json.loads((bundle / "meta.json").read_text())
    # A bump at three tokens, as the CPU bundles measure: a smooth surface through the shapes would
    # move it onto the one- and four-token forwards.
    meta["fits"]["forward_factor"] = {"tokens": [1, 3, 4], "kv": [256, 4096],
                                      "factor": [[1.05, 1.10], [1.40, 1.30], [1.02, 1.00]]}
    (bundle / "meta.json").write_text(json.dumps(meta))
    factor = load_bundle(bundle).forward_factor()
    assert factor(1, 256) == pytest.approx(1.05) and factor(3, 4096) == pytest.approx(1.30)
    assert factor(4, 256) == pytest.approx(1.02)
    # Between shapes: log-linear in both; outside: held at the nearest shape.
    assert factor(1, 1024) == pytest.approx(math.sqrt(1.05 * 1.10))
    assert 1.02 < factor(2, 256) < 1.40 and factor(64, 256) == pytest.approx(1.02)
    assert factor(1, 64) == pytest.approx(1.05) and factor(4, 16384) == pytest.approx(1.00)
    # The cost model multiplies a decode forward by it.
    from sim.cost.model import cost_model_for
    from sim.scenario.load import load_scenario

    from sim.cost.stack import build_stacks

    scenario = load_scenario(smollm2_scenario(calibration=str(bundle)))
    assert cost_model_for(scenario).pricer(build_stacks(scenario).target).forward_factor(1, 256) == pytest.approx(1.05)


def test_selection_is_priced_by_its_own_factor_measured_in_forwards(tmp_path):
    from sim.cost.batch import PHASES
    from sim.cost.model import cost_model_for
    from sim.cost.stack import build_stacks
    from sim.scenario.load import load_scenario

    def selection_s(bundle, part, requests=1, context=1024):
        scenario = load_scenario(smollm2_scenario(calibration=str(bundle)))
        cost = cost_model_for(scenario)
        return cost.selection(build_stacks(scenario).target, requests, requests * context, requests * 5, 1024, 16,
                              [0.0] * len(PHASES), part=part)

    committed = load_bundle(BUNDLE)
    table = committed.table("selection")
    # Without the fit, the whole-forward factor at the step's query tokens prices it, as before.
    without = with_selection_factor(tmp_path / "none", None)
    assert selection_s(without, "scores") == pytest.approx(
        30 * table(1, 1024, 1024) * committed.forward_factor()(5, 1024), rel=1e-12)
    # With it: layers x table x the measured factor, interpolated in log space between its shapes
    # and held outside them; the summaries keep the whole-forward factor.
    doubled = with_selection_factor(tmp_path / "a", [[2.0, 2.0], [2.0, 2.0]])
    assert selection_s(doubled, "scores") == pytest.approx(30 * table(1, 1024, 1024) * 2.0, rel=1e-12)
    assert selection_s(doubled, "summaries") == selection_s(without, "summaries")
    ramp = with_selection_factor(tmp_path / "b", [[1.0, 4.0], [1.0, 4.0]])
    assert selection_s(ramp, "scores") == pytest.approx(30 * table(1, 1024, 1024) * 2.0, rel=1e-12)  # log-midpoint
    assert selection_s(ramp, "scores", requests=16, context=8192) == pytest.approx(
        30 * table(16, 8192, 1024) * 4.0, rel=1e-12)                                                # held
    broken = with_selection_factor(tmp_path / "c", [[2.0, 2.0]])
    with pytest.raises(InputError, match="selection_factor has"):
        load_bundle(broken)


def test_bundle_for_another_model_or_dtype_is_an_error_naming_both():
    with pytest.raises(InputError, match="smollm2-135m fp32, the scenario runs llama-3.2-1b fp32"):
        simulate(smollm2_scenario(model="llama-3.2-1b"))
    with pytest.raises(InputError, match="smollm2-135m fp32, the scenario runs smollm2-135m bf16"):
        simulate(smollm2_scenario(dtype="bf16"))


def test_calibration_with_tensor_parallelism_is_refused():
    with pytest.raises(InputError, match="tensor_parallel and data_parallel must be 1"):
        simulate(smollm2_scenario(tensor_parallel=3))


def test_bundle_from_another_device_is_a_warning_in_the_result():
    result = simulate(smollm2_scenario(hardware="rtx-4090"))
    assert any("measured on" in w and "rtx-4090" in w for w in result.provenance["warnings"])


def test_round_spread_is_the_median_span_of_timed_points_with_rounds():
    import pandas as pd

    frame = pd.DataFrame({
        "op": ["linear.o", "linear.o", "attention", "attention_prefill", "attention_prefill"],
        "query": [0, 0, 1, 128, 256], "kv": [0, 0, 64, 256, 128], "spread": [1.0, 0.0, 0.2, 0.3, 9.0]})
    # The copy below prefill's diagonal (kv < query) is no timing of its own: median of 1, 0, 0.2, 0.3.
    assert round_spread(frame, rounds=3) == pytest.approx(0.25)
    assert round_spread(frame, rounds=1) is None         # one round: `spread` is within that round
    # More rounds span more for the same noise: put at three rounds by the normal range's d2(n)
    # (the control-chart constants 1.128, 1.693, 2.059, 2.326).
    assert [round(expected_range(n), 3) for n in (2, 3, 4, 5)] == [1.128, 1.693, 2.059, 2.326]
    assert round_spread(frame, rounds=5) == pytest.approx(0.25 * 1.6926 / 2.3259, rel=1e-4)
    assert round_spread(frame, rounds=2) == pytest.approx(0.25 * 1.6926 / 1.1284, rel=1e-4)
    assert rounds_note(3) == "" and rounds_note(5) == " (scaled to three rounds; 5 timed)"


def test_bundle_above_the_held_out_target_is_a_warning_with_its_timing_noise(tmp_path):
    bundle = copy_bundle(tmp_path)
    meta = json.loads((bundle / "meta.json").read_text())
    noise = load_bundle(bundle).round_spread
    assert 0 < noise < 1          # the committed bundle's three rounds
    for held, warned in ((0.08, True), (HELD_OUT_TARGET, False)):
        meta["held_out"]["median_abs_error"] = held
        (bundle / "meta.json").write_text(json.dumps(meta))
        warnings = simulate(smollm2_scenario(calibration=str(bundle))).provenance["warnings"]
        expected = (f"calibration {repo_relative(bundle)} holds out within a median 8.0% (target 5%); its timing rounds of one "
                    f"point spanned a median {noise:.1%}")
        assert warnings == ([expected] if warned else [])
    # A bundle of five rounds: its figure scaled to three, and said so.
    meta["held_out"]["median_abs_error"], meta["rounds"] = 0.08, 5
    (bundle / "meta.json").write_text(json.dumps(meta))
    warnings = simulate(smollm2_scenario(calibration=str(bundle))).provenance["warnings"]
    assert warnings == [f"calibration {repo_relative(bundle)} holds out within a median 8.0% (target 5%); its timing rounds of one "
                        f"point spanned a median {noise * expected_range(3) / expected_range(5):.1%} "
                        f"(scaled to three rounds; 5 timed)"]


def test_calibration_summary_reports_timing_noise_and_a_missed_target():
    from profiler.calibrate.run import format_calibration_summary

    meta = {"device": {"name": "cpu"}, "dtype": "fp32", "model": {"name": "m"}, "duration_s": 600.0, "fits": {},
            "rounds": 3, "held_out": {"median_abs_error": 0.04, "p90_abs_error": 0.1, "max_abs_error": 0.2,
                                      "points": 10, "round_spread": 0.153}}
    summary = format_calibration_summary(Path("b"), meta)
    assert "timing noise: the rounds of one point span a median 15.3% of its time\n" in summary + "\n"
    meta["rounds"] = 4
    assert "15.3% of its time (scaled to three rounds; 4 timed)" in format_calibration_summary(Path("b"), meta)
    assert "note:" not in summary
    meta["held_out"]["median_abs_error"] = 0.056
    assert "note: the held-out error is above its target (5%)" in format_calibration_summary(Path("b"), meta)
    meta["held_out"]["round_spread"] = None          # one round: no figure
    assert "timing noise:" not in format_calibration_summary(Path("b"), meta)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "profile.parquet").unlink(), "profile.parquet is missing"),
    (lambda d: (d / "meta.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "profile.parquet").write_bytes(b"PAR1 broken"), "cannot be read"),
    (lambda d: (d / "meta.json").write_text(json.dumps({**json.loads((d / "meta.json").read_text()),
                                                          "schema_version": 99})), "schema version 99"),
])
def test_damaged_bundle_is_a_one_line_error(tmp_path, damage, message):
    bundle = copy_bundle(tmp_path)
    damage(bundle)
    with pytest.raises(InputError, match=message) as info:
        simulate(smollm2_scenario(calibration=str(bundle)))
    assert "\n" not in str(info.value)


def test_missing_bundle_folder_on_the_command_line(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("hardware: cpu\nmodel: smollm2-135m\ndtype: fp32\ncalibration: nowhere/at/all\n")
    out = subprocess.run([sys.executable, "-m", "sim", "run", str(scenario)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("error: calibration: no such bundle folder") and out.stderr.count("\n") == 1


# ---- calibrate and inspect end to end -----------------------------------------------------------

TINY = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512,
        "tie_word_embeddings": True, "max_position_embeddings": 1024}


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calibrate")
    config = folder / "config.json"
    config.write_text(json.dumps(TINY))
    out = folder / "bundle"
    run = subprocess.run([sys.executable, "-m", "profiler", "calibrate", "--model", str(config), "--quick",
                          "--device", "cpu", "--out", str(out)], capture_output=True, text=True, cwd=folder)
    assert run.returncode == 0, run.stderr[-2000:]
    return config, out, run.stdout


def test_calibrate_writes_a_complete_bundle(tiny_bundle):
    config, out, stdout = tiny_bundle
    assert "held-out error" in stdout
    bundle = load_bundle(out)
    meta = bundle.meta
    from profiler.engine.loaders import hf_llama_config

    assert meta["model"]["hash"] == model_hash(hf_llama_config(config))
    assert meta["schema_version"] == 1 and meta["quick"] and meta["rounds"] == 1
    assert meta["held_out"]["points"] > 0 and math.isfinite(meta["held_out"]["median_abs_error"])
    assert meta["held_out"]["round_spread"] is None and bundle.round_spread is None     # one round a point
    fits = meta["fits"]
    assert np.min(fits["forward_factor"]["factor"]) > 0 and fits["step_overhead_s"] >= 0
    # Decode forwards (at most 16 tokens: one query token each) are timed in the round's burst and
    # in DECODE_BURSTS_WITHIN_ROUND more spread through the operators; the others once a round.
    factor = fits["forward_factor"]
    for tokens, row in zip(factor["tokens"], factor["bursts_s"]):
        expected = meta["rounds"] * (1 + DECODE_BURSTS_WITHIN_ROUND if tokens <= DECODE_TOKENS else 1)
        assert [len(bursts) for bursts in row] == [expected] * len(factor["kv"])
        assert all(s > 0 for bursts in row for s in bursts)
    # Selection timed in partial-verification forwards of the tiny model: batch 1 and 4 at the one
    # context that fits its 1,024 positions.
    selection = fits["selection_factor"]
    assert selection["batch"] == [1, 4] and selection["context"] == [512]
    assert np.min(selection["factor"]) > 0 and bundle.selection_factor() is not None
    # The machine probe, once a round, at shapes that fit the tiny model's context.
    probe = fits["machine_probe"]
    assert probe["shapes"] == {"decode_kv": 512, "prompt_tokens": 256} and len(probe["rounds"]) == 1
    assert probe["prompt_s"] > probe["decode_s"] > 0
    import pandas as pd

    frame = pd.read_parquet(out / "profile.parquet")
    assert (frame.seconds > 0).all() and frame.held_out.any()
    assert not list(out.parent.glob(".bundle.*")), "temporary folders left behind"
    # Its GEMM and attention times in the published tables' layout, which the same loader reads.
    from sim.cost.measured_tables import operator_tables
    from sim.formats.operator_layout import user_tables_root

    tables = operator_tables("cpu", "live", None, user_tables_root(out))
    qkv = frame[(frame.op == "linear.qkv") & ~frame.held_out].iloc[0]
    assert tables.gemm("float32").lookup(64, qkv.tokens, 128)[0] == pytest.approx(qkv.seconds)
    assert tables.attention("generation_attention_perf", 4, 2, 16, "float32").exact
    # The simulator reads it for a scenario of the same config.
    result = simulate({"hardware": "cpu", "model": str(config), "dtype": "fp32", "calibration": str(out),
                       "workload": {"concurrency": 2, "requests": 4, "prompt_tokens": 100, "output_tokens": 16}})
    assert result.baseline.throughput_tok_s > 0 and pricing_warnings(result) == []


def test_whole_prompts_read_the_prompt_table_and_chunks_after_a_prefix_the_prefill_table(tiny_bundle, tmp_path):
    import pandas as pd

    from sim.cost.model import cost_model_for
    from sim.cost.stack import build_stacks
    from sim.scenario.load import load_scenario

    config, out, _ = tiny_bundle

    def priced(bundle):
        scenario = load_scenario({"hardware": "cpu", "model": str(config), "dtype": "fp32", "calibration": str(bundle)})
        return cost_model_for(scenario).pricer(build_stacks(scenario).target)

    bundle = load_bundle(out)
    p = priced(out)
    # A prompt attends only to itself (KV = query): the engine's causal prompt path, no mask.
    assert p.request_s(300, 300) == pytest.approx(bundle.table("attention_prompt")(300), rel=1e-12)
    # Past the table's longest prompt the price grows with the square of the prompt, as its work.
    prompt = bundle.table("attention_prompt")
    top = float(prompt.axes[0][-1])
    assert p.request_s(2 * top, 2 * top) == pytest.approx(4 * prompt(top), rel=1e-12)
    # A chunk after 300 cached tokens runs masked: the prefill table at (query, KV).
    assert p.request_s(300, 600) == pytest.approx(bundle.table("attention_prefill")(300, 600), rel=1e-12)
    # A bundle measured before the prompt path prices prompts from the prefill table, as then.
    older = tmp_path / "older"
    shutil.copytree(out, older)
    frame = pd.read_parquet(older / "profile.parquet")
    frame[frame.op != "attention_prompt"].to_parquet(older / "profile.parquet")
    meta = json.loads((older / "meta.json").read_text())
    del meta["grid"]["attention_prompt"]
    (older / "meta.json").write_text(json.dumps(meta))
    assert load_bundle(older).table("attention_prompt") is None
    assert priced(older).request_s(300, 300) == pytest.approx(bundle.table("attention_prefill")(300, 300), rel=1e-12)


def test_refit_keeps_the_operator_times_and_redoes_the_engine_fits(tiny_bundle, tmp_path):
    import pandas as pd

    config, out, _ = tiny_bundle
    copy = tmp_path / "refit"
    shutil.copytree(out, copy)
    run = subprocess.run([sys.executable, "-m", "profiler", "calibrate", "--model", str(config), "--quick",
                          "--device", "cpu", "--refit", str(copy)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    pd.testing.assert_frame_equal(pd.read_parquet(copy / "profile.parquet"), pd.read_parquet(out / "profile.parquet"))
    meta, before = json.loads((copy / "meta.json").read_text()), json.loads((out / "meta.json").read_text())
    assert meta["refit"]["duration_s"] > 0 and meta["date"] == before["date"]
    assert set(meta["fits"]) == set(before["fits"]) and "selection_factor" in meta["fits"]
    assert meta["refit"]["rounds"] == 1 and "engine fits redone in" in run.stdout
    assert len(meta["fits"]["forward_factor"]["bursts_s"][0][0]) == 1 + DECODE_BURSTS_WITHIN_ROUND
    # A bundle of a few operators has nothing to fit the engine against: one line, exit 2.
    subset = tmp_path / "subset"
    run = subprocess.run([sys.executable, "-m", "profiler", "calibrate", "--model", str(config), "--quick",
                          "--device", "cpu", "--operators", "linear.qkv", "--out", str(subset)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and "note: no engine fits" in run.stdout, run.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "profiler", "calibrate", "--model", str(config), "--quick",
                          "--device", "cpu", "--refit", str(subset)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.startswith("error: --refit:") and "has no linear.o" in run.stderr
    assert run.stderr.count("\n") == 1


@pytest.mark.parametrize("max_rounds, budget_s, expected", [(None, 1e6, 2), (4, 1e6, 4), (4, -1.0, 2), (1, 1e6, 2)])
def test_more_rounds_while_one_more_fits_the_deadline(tmp_path, max_rounds, budget_s, expected):
    """At least the planned rounds, then more up to max_rounds while one more ends in time; each
    round ends with the engine's (after_round) and every point keeps every round."""
    torch = pytest.importorskip("torch")
    import time

    from profiler.calibrate.rounds import measure_operators
    from profiler.engine.loaders import hf_llama_config

    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(TINY))
    grid = {"linear.o": {"tokens": [1, 4]}, "accept": {"batch": [1, 2], "tokens": [1, 3]}}
    held = {"linear.o": [{"tokens": 2}]}
    engine_rounds = []
    frame, rounds = measure_operators(hf_llama_config(config_path), torch.float32, "cpu", grid, held, 2, 0,
                                      after_round=lambda: engine_rounds.append(1), max_rounds=max_rounds,
                                      deadline=time.perf_counter() + budget_s)
    assert rounds == expected and len(engine_rounds) == expected
    assert len(frame) == 7 and all(len(r) == expected for r in frame.round_seconds)


def test_another_round_only_while_one_as_long_as_the_longest_ends_in_time():
    from profiler.calibrate.rounds import another_round

    assert another_round(2, 3, 5, now_s=100.0, longest_round_s=50.0, deadline=0.0)        # below the minimum
    assert another_round(3, 3, 5, now_s=100.0, longest_round_s=50.0, deadline=150.0)      # ends just in time
    assert not another_round(3, 3, 5, now_s=100.0, longest_round_s=50.1, deadline=150.0)
    assert not another_round(5, 3, 5, now_s=0.0, longest_round_s=1.0, deadline=1e9)       # at the maximum
    assert not another_round(3, 3, 5, now_s=0.0, longest_round_s=1.0, deadline=None)      # no deadline: fixed


def test_quantized_operator_copies_on_one_bench_are_clones(tmp_path):
    torch = pytest.importorskip("torch")
    from profiler.engine.loaders import hf_llama_config
    from profiler.calibrate.operators import OPERATORS, Bench, random_pool

    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(TINY))
    bench = Bench(hf_llama_config(config_path), torch.float32, "cpu", torch.Generator().manual_seed(0),
                  random_pool(1 << 16, torch.float32, "cpu", 0))
    first, second = (OPERATORS["int4.gate_up"].build(bench, {"tokens": 2}) for _ in range(2))
    int8 = OPERATORS["int8.gate_up"].build(bench, {"tokens": 2})
    from profiler.engine.shadow import QuantLinear

    # Each built operator is `lambda: layer(x)`: its layer is in the closure.
    layers = [next(c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, QuantLinear))
              for fn in (first, second, int8)]
    assert torch.equal(layers[0].dense, layers[1].dense) and layers[0].dense.data_ptr() != layers[1].dense.data_ptr()
    assert layers[2].packed["bits"] == 8 and not torch.equal(layers[2].dense, layers[0].dense)


def test_extra_bursts_are_spread_evenly_through_a_round_and_none_is_lost():
    assert evenly_spaced_positions(100, 2) == [33, 66]
    assert evenly_spaced_positions(3, 2) == [1, 2]
    assert evenly_spaced_positions(1, 2) == [0, 0]           # fewer points than calls: both still run
    assert evenly_spaced_positions(100, 0) == []


def test_whole_forwards_are_timed_on_one_random_cache_kept_for_the_calibration(tmp_path):
    """EngineProbe's forwards read one set of KV caches made once, of the largest batch and KV it
    times, holding random values (never zeros); a larger shape than planned gets a larger one."""
    torch = pytest.importorskip("torch")
    from profiler.calibrate.fits import EngineProbe
    from profiler.engine.loaders import hf_llama_config

    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(TINY))
    probe = EngineProbe(hf_llama_config(config_path), torch.float32, "cpu", 0, quick=True, selection=False)
    planned = [*probe.forward_s, *probe.check_s]
    shapes = [(3, 1, 100), (1, 1, 256), (2, 4, 300)]
    seconds = probe.time_forwards(shapes)
    assert set(seconds) == set(shapes) and all(s > 0 for s in seconds.values())
    keys = probe.timing_cache[0][0]
    assert keys.shape[0] == max(b for b, _, _ in planned) and keys.shape[2] == max(kv for _, _, kv in planned) + 1
    assert keys.abs().min() > 0 and keys.std() > 0.5           # random values, no zeros
    layers = probe.model.layers
    assert layers[1].attention.k_cache is probe.timing_cache[1][0] and keys is not probe.timing_cache[1][0]
    probe.model.setup_cache(1, 1)        # what the decoding runs between bursts do
    probe.time_forwards([(1, 1, 200)])
    assert probe.timing_cache[0][0] is keys and layers[0].attention.k_cache is keys     # kept, put back
    beyond = keys.shape[2] + 10
    probe.time_forwards([(1, 1, beyond)])
    assert probe.timing_cache[0][0].shape[2] == beyond + 1


def test_quantized_operator_copies_are_clones_in_their_own_memory():
    torch = pytest.importorskip("torch")
    from profiler.engine.shadow import QuantLinear

    layer = torch.nn.Linear(128, 32, bias=False)
    first = QuantLinear(layer, 4, 64, use_kernel=False)
    twin = first.clone()
    x = torch.randn(3, 128)
    assert torch.equal(first(x), twin(x))
    assert twin.dense.data_ptr() != first.dense.data_ptr()
    assert all(twin.packed[k].data_ptr() != first.packed[k].data_ptr() for k in ("codes", "scale", "zero"))


def test_inspect_prints_achieved_rates(tiny_bundle):
    _, out, _ = tiny_bundle
    run = subprocess.run([sys.executable, "-m", "profiler", "inspect", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    for text in ("linear.gate_up", "attention", "best GB/s", "of spec", "held-out error"):
        assert text in run.stdout
    assert "timing noise" not in run.stdout          # a quick bundle: one round a point
    committed = subprocess.run([sys.executable, "-m", "profiler", "inspect", str(BUNDLE)], capture_output=True,
                               text=True, check=True)
    noise = load_bundle(BUNDLE).round_spread
    assert f"timing noise: the rounds of one point span a median {noise:.1%} of its time" in committed.stdout


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--model", "no-such-model"], "error: --model: 'no-such-model' is not smollm2"),
    (["calibrate", "--operators", "linear.qkv,warp"], "error: --operators: unknown operator 'warp'"),
    (["calibrate", "--rounds", "0"], "error: --rounds: 0 must be at least 1"),
    (["inspect", "/no/such/bundle"], "error: calibration: no such bundle folder"),
])
def test_calibrate_bad_input_is_one_line(argv, message):
    run = subprocess.run([sys.executable, "-m", "profiler", *argv], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.startswith(message) and run.stderr.count("\n") == 1, run.stderr


def test_cpu_timing_is_the_median_call_of_blocks_after_warm_up(monkeypatch):
    import time

    from profiler.calibrate.timing import CPU_BLOCK_S, time_call

    # A clock that only the timed call moves, so the test checks the method, not this machine's
    # load (a real 1 ms sleep under a wall-clock bound passes or fails with what else runs).
    # Binary fractions of a second keep the arithmetic exact.
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    calls = []

    def call_of(seconds):
        def call():
            calls.append(None)
            now[0] += seconds
        return call

    per_call_s = 2.0 ** -10                         # about 1 ms
    timing = time_call(call_of(per_call_s), "cpu", min_run_time_s=0.03)
    per_block = int(CPU_BLOCK_S / per_call_s)       # 2 calls a block
    blocks = -(-0.03 // (per_block * per_call_s))   # until 30 ms have passed: 16 blocks
    assert timing.median_s == per_call_s and timing.spread == 0.0
    assert timing.runs == blocks * per_block == 32
    assert len(calls) == timing.runs + 2            # two warm-up calls, then every timed one

    calls.clear()
    long = time_call(call_of(0.05), "cpu", min_run_time_s=0.03)
    assert long.runs == 1 and len(calls) == 3       # one block of one call is longer than the budget
    assert long.median_s == pytest.approx(0.05, rel=1e-12)


def test_a_host_operator_is_timed_by_the_hosts_clock_on_a_gpu_too(monkeypatch):
    # CUDA events time the GPU's stream, which prompt lookup leaves idle: they read about zero.
    pytest.importorskip("torch")
    import torch

    from profiler.calibrate import rounds, timing
    from profiler.calibrate.operators import OPERATORS
    from profiler.engine.loaders import preset_config

    devices = []
    monkeypatch.setattr(timing, "time_call", lambda fn, device, min_run_time_s: devices.append(device) or fn())
    timer = rounds.PointTimer(preset_config("smollm2-135m"), torch.float32, "cuda", seed=0)
    timer.time_point("ngram", {"context": 64}, generator_seed=0, pool_offset=0)
    assert devices == ["cpu"]
    assert [name for name, op in OPERATORS.items() if op.host] == ["ngram"]
