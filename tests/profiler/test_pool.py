"""`profiler calibrate --pool`: black-box server bundles pooled by their measured points."""
import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO

LLAMA = REPO / "calibration" / "cpu-llama-cpp" / "smollm2-135m"
EAGLE = REPO / "calibration" / "cpu-vllm" / "smollm2-135m-eagle1"


def slowed_copy(bundle, out, factor: float):
    """The bundle as if its machine had run `factor` times slower: every measured step and prefill."""
    shutil.copytree(bundle, out)
    meta = json.loads((out / "meta.json").read_text())
    for step in meta["measured_steps"]:
        step["step_s"] *= factor
    for points in meta.get("measured_prefill", {}).values():
        for tokens in points:
            points[tokens] *= factor
    meta["date"] = "2026-12-05T00:00:00+00:00"
    (out / "meta.json").write_text(json.dumps(meta))
    frame = pd.read_parquet(out / "profile.parquet")
    prefill = frame.op == "engine_prefill"
    frame.loc[prefill, "seconds"] *= factor
    frame.to_parquet(out / "profile.parquet", index=False)
    return out


def profile_of(bundle) -> pd.DataFrame:
    frame = pd.read_parquet(bundle / "profile.parquet")
    return frame.sort_values(["op", "batch", "query", "kv", "tokens"]).reset_index(drop=True)


@pytest.mark.parametrize("bundle", [LLAMA, EAGLE], ids=["llama.cpp", "vllm-eagle"])
def test_a_bundle_pooled_with_itself_gives_back_its_tables(bundle, tmp_path):
    """The tables are derived from the measured points as calibrate derived them: pooling a bundle
    with itself changes no table and doubles its passes."""
    from profiler.serve.pool import pool_bundles

    out = pool_bundles([bundle, bundle], tmp_path / "pooled")
    mine, theirs = profile_of(out), profile_of(bundle)
    assert list(mine.op) == list(theirs.op)
    assert mine.seconds.to_numpy() == pytest.approx(theirs.seconds.to_numpy(), rel=1e-9)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["rounds"] == 2 * json.loads((bundle / "meta.json").read_text())["rounds"]
    assert [p["bundle"] for p in meta["pooled_from"]] == [str(bundle.relative_to(REPO))] * 2


def test_pooled_bundles_price_between_them(tmp_path):
    """A bundle and the same measurements 50% slower pool to 25% slower: every decode point is
    weighted by its gaps, every prefill point the mean, and the sim prices from the pool."""
    from profiler.serve.pool import pool_bundles
    from sim.formats.bundle import load_bundle

    slow = slowed_copy(LLAMA, tmp_path / "slow", 1.5)
    out = pool_bundles([LLAMA, slow], tmp_path / "pooled")
    base = profile_of(LLAMA)
    pooled = profile_of(out)
    assert pooled.seconds.to_numpy() == pytest.approx(1.25 * base.seconds.to_numpy(), rel=1e-9)
    meta = json.loads((out / "meta.json").read_text())
    assert [p["date"] for p in meta["pooled_from"]][1] == "2026-12-05T00:00:00+00:00"
    table = load_bundle(out).table("engine_forward")
    assert table(1, 3, 560) == pytest.approx(1.25 * load_bundle(LLAMA).table("engine_forward")(1, 3, 560))


def test_bundles_that_differ_are_refused_in_one_line(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(LLAMA, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["versions"]["llama.cpp"] = "0.0.1"
    (other / "meta.json").write_text(json.dumps(meta))
    cases = [
        ([str(LLAMA), str(other)], "differs from", "engine version"),
        ([str(LLAMA), str(EAGLE)], "differs from", "engine"),
        ([str(LLAMA), str(REPO / "calibration" / "cpu" / "smollm2-135m")], "is not a bundle of an engine's server", ""),
        ([str(LLAMA)], "two or more", ""),
    ]
    for bundles, message, field in cases:
        out = tmp_path / "never"
        done = subprocess.run([sys.executable, "-m", "profiler", "calibrate", "--pool", *bundles, "--out", str(out)],
                              cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and field in lines[0], done.stderr
        assert not out.exists()
