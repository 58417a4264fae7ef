"""The machine's speed at a run against its bundle's: the probe priced by the bundle, and a
prediction put at the measured speed."""
import shutil

import pandas as pd
import pytest
from conftest import REPO

from sim.formats.run_folder import probe_shapes
from sim.validate.machine_speed import measured_probe, priced_probe, scaled_seconds, speed_ratios
from sim.validate.machine_speed import at_run_speed

BUNDLE = REPO / "calibration" / "cpu" / "smollm2-135m"
SCENARIO = {"model": "smollm2-135m", "dtype": "fp32", "hardware": "cpu", "engine": "gpt-fast"}


def test_a_bundle_twice_as_slow_prices_the_probe_twice_as_long(tmp_path):
    slower = tmp_path / "slower"
    shutil.copytree(BUNDLE, slower)
    frame = pd.read_parquet(slower / "profile.parquet")
    frame["seconds"] *= 2.0
    frame.to_parquet(slower / "profile.parquet", index=False)
    shapes = probe_shapes(8192)
    assert shapes == {"decode_kv": 512, "prompt_tokens": 256} and probe_shapes(256) == {"decode_kv": 128,
                                                                                         "prompt_tokens": 128}
    base = priced_probe({**SCENARIO, "calibration": str(BUNDLE)}, shapes)
    twice = priced_probe({**SCENARIO, "calibration": str(slower)}, shapes)
    assert twice["decode_s"] == pytest.approx(2 * base["decode_s"]) and twice["prompt_s"] == pytest.approx(2 * base["prompt_s"])
    # A prompt of 256 tokens costs several decode forwards; both well above zero.
    assert base["prompt_s"] > 3 * base["decode_s"] > 0
    assert priced_probe(SCENARIO, shapes) is None                 # roofline: no bundle to compare with


def test_the_run_probe_is_the_mean_of_before_and_after():
    meta = {"machine_probe": {"before": {"decode_s": 0.05, "prompt_s": 0.4}, "after": {"decode_s": 0.07, "prompt_s": 0.6},
                              "shapes": {"decode_kv": 512, "prompt_tokens": 256}}}
    probe = measured_probe(meta)
    assert probe["decode_s"] == pytest.approx(0.06) and probe["prompt_s"] == pytest.approx(0.5)
    assert measured_probe({}) is None
    assert speed_ratios(probe, {"decode_s": 0.05, "prompt_s": 0.5}) == pytest.approx({"decode": 1.2, "prompt": 1.0})


def test_a_prediction_at_the_run_speed_scales_prefill_and_decode_by_their_probes():
    assert scaled_seconds(10.0, 2.0, {"decode": 1.5, "prompt": 0.5}) == pytest.approx(2.0 * 0.5 + 8.0 * 1.5)
    guess = {"tok_s": 100.0, "seconds": 10.0, "prefill_s": 2.0, "base_seconds": 15.0, "base_prefill_s": 2.0,
             "speedup": 1.5, "decode_speedup": 13.0 / 8.0, "tpot_ms": 50.0, "tokens_per_step": 2.5, "share": {},
             "ttft_p50_ms": 400.0, "tpot_p50_ms": 45.0}
    slow = {"decode": 1.2, "prompt": 1.0}
    out = at_run_speed(guess, slow, slow)
    assert out["tok_s"] == pytest.approx(1000.0 / (2.0 + 8.0 * 1.2))
    assert out["speedup"] == pytest.approx((2.0 + 13.0 * 1.2) / (2.0 + 8.0 * 1.2))
    assert out["tpot_ms"] == pytest.approx(60.0) and out["tokens_per_step"] == 2.5
    assert out["tpot_p50_ms"] == pytest.approx(54.0) and out["ttft_p50_ms"] == pytest.approx(400.0)
    # The baseline measured at another speed than the run moves the predicted speedup with it.
    faster_base = at_run_speed(guess, slow, {"decode": 1.0, "prompt": 1.0})
    assert faster_base["speedup"] == pytest.approx(15.0 / (2.0 + 8.0 * 1.2))
    assert faster_base["decode_speedup"] == pytest.approx(13.0 / 8.0 / 1.2)
    autoregressive = at_run_speed({**guess, "speedup": None, "decode_speedup": None}, slow, slow)
    assert autoregressive["speedup"] is None


def bundle_with_probe(tmp_path, decode_s: float, prompt_s: float):
    """The committed bundle with a calibration probe of these seconds in its fits (None: none)."""
    import json

    copy = tmp_path / ("bundle" if decode_s is not None else "bundle-without-probe")
    shutil.copytree(BUNDLE, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["fits"].pop("machine_probe", None)
    if decode_s is not None:
        meta["fits"]["machine_probe"] = {"decode_s": decode_s, "prompt_s": prompt_s,
                                         "shapes": {"decode_kv": 512, "prompt_tokens": 256}}
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


def with_probe(tmp_path, source, decode_s: float, prompt_s: float):
    """A copy of a committed run folder whose meta.json carries a probe of these seconds (None:
    no probe)."""
    import json

    copy = tmp_path / "runs" / source.name
    shutil.copytree(source, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta.pop("machine_probe", None)
    if decode_s is not None:
        meta["machine_probe"] = {"before": {"decode_s": decode_s, "prompt_s": prompt_s},
                                 "after": {"decode_s": decode_s, "prompt_s": prompt_s},
                                 "shapes": {"decode_kv": 512, "prompt_tokens": 256}}
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


def test_validate_puts_predictions_at_the_runs_speed_against_the_calibrations_probe(tmp_path):
    from sim.validate.runs import read_runs
    from sim.validate.compare import PRICED_PROBE_NOTE, compare_runs

    study = REPO / "validation" / "cpu-default"
    # The machine 25% slower at the speculative run than at calibration, 10% slower at its baseline.
    runs = read_runs([with_probe(tmp_path, study / "ngram-c512-b1", 0.075, 0.625),
                      with_probe(tmp_path, study / "none-c512-b1", 0.066, 0.55)])
    rows = {(r.run, r.prediction): r for r in compare_runs(runs, bundle_with_probe(tmp_path, 0.06, 0.5))}
    plain, scaled = rows[("ngram-c512-b1", "replay")], rows[("ngram-c512-b1", "replay @ probe")]
    assert scaled.predicted_tok_s == pytest.approx(plain.predicted_tok_s / 1.25)
    assert scaled.predicted_speedup == pytest.approx(plain.predicted_speedup * 1.1 / 1.25)
    assert scaled.predicted_tokens_per_step == plain.predicted_tokens_per_step and scaled.note == ""
    assert plain.note == ""                  # 1.25x: within one machine's drift
    # A run whose probe reads 1.5x the calibration's ran on another machine state: said on its rows.
    other = read_runs([with_probe(tmp_path / "other", study / "none-c512-b1", 0.09, 0.75)])
    noted = compare_runs(other, bundle_with_probe(tmp_path / "other", 0.06, 0.5))
    assert all("1.50x (decode) and 1.50x (prompt) the calibration's" in r.note for r in noted)
    base = rows[("none-c512-b1", "cost model @ probe")]
    assert base.predicted_tok_s == pytest.approx(rows[("none-c512-b1", "cost model")].predicted_tok_s / 1.1)
    # A bundle without a probe: the reference is its price of the probe, and the row says so.
    unprobed = bundle_with_probe(tmp_path, None, None)
    priced = [r for r in compare_runs(runs[1:], unprobed) if r.prediction.endswith("@ probe")]
    assert len(priced) == 1 and priced[0].note == PRICED_PROBE_NOTE
    # No probe in the run, or no bundle: no prediction at the run's speed.
    bare = read_runs([with_probe(tmp_path / "bare", study / "none-c512-b1", None, None)])
    assert not [r for r in compare_runs(bare, BUNDLE) if "@ probe" in r.prediction]
    assert not [r for r in compare_runs(runs, None) if "@ probe" in r.prediction]


def test_a_calibration_probe_of_other_shapes_is_not_compared():
    from sim.validate.machine_speed import calibration_probe

    meta = {"fits": {"machine_probe": {"decode_s": 0.05, "prompt_s": 0.4, "shapes": {"decode_kv": 512, "prompt_tokens": 256}}}}
    assert calibration_probe(meta, {"decode_kv": 512, "prompt_tokens": 256}) == {"decode_s": 0.05, "prompt_s": 0.4}
    assert calibration_probe(meta, {"decode_kv": 128, "prompt_tokens": 128}) is None
    assert calibration_probe({"fits": {}}, {"decode_kv": 512, "prompt_tokens": 256}) is None
