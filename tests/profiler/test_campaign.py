"""A campaign's runs in one process (profiler/campaign.py, profiler/live/shared.py): one KV cache size
for the runs of a batch whatever their k, the draft head, the synthetic records and the launch count
made once, and a run that fails recorded while the others run."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")

from conftest import REPO  # noqa: E402
from profiler.live.config import LiveConfig  # noqa: E402
from profiler.live.shared import SharedAcrossRuns, room_tokens  # noqa: E402


def settings(tmp_path, name, **fields) -> LiveConfig:
    base = dict(model="smollm2-135m", batch=2, limit=2, max_new_tokens=4, threads=1, seed=0)
    return LiveConfig(**{**base, **fields}, out=tmp_path / name)


def test_the_runs_of_a_batch_share_the_largest_room_any_of_them_needs(tmp_path):
    runs = [settings(tmp_path, "none", method="none"), settings(tmp_path, "k3", method="synthetic", acceptance=0.8, k=3),
            settings(tmp_path, "k5", method="synthetic", acceptance=0.8, k=5),
            settings(tmp_path, "k5-b4", method="synthetic", acceptance=0.8, k=5, batch=4, limit=4)]
    assert [room_tokens(s) for s in runs] == [4, 10, 14, 14]
    shared = SharedAcrossRuns.for_runs(runs)
    assert [shared.room_for(s) for s in runs] == [14, 14, 14, 14]
    assert [shared.depth_for(s) for s in runs] == [5, 5, 5, 5]         # records reach the deepest draft
    alone = SharedAcrossRuns.for_runs(runs[:2])
    assert [alone.room_for(s) for s in runs] == [10, 10, 14, 14]
    specpv = settings(tmp_path, "specpv", method="synthetic", acceptance=0.8, k=3, budget=64, period=20)
    assert room_tokens(specpv) == 10 + 20 + 3 + 1


def test_runs_sharing_a_process_build_the_head_record_and_count_launches_once(tmp_path):
    from profiler.live.run import run_live

    runs = [settings(tmp_path, "none", method="none"),
            settings(tmp_path, "a0.8", method="synthetic", acceptance=0.8, k=3),
            settings(tmp_path, "a0.6", method="synthetic", acceptance=0.6, k=3)]
    shared = SharedAcrossRuns.for_runs(runs)
    for run in runs:
        run_live(run, shared=shared, quiet=True)
    assert len(shared.models) == 1 and len(shared.drafts) == 1 and len(shared.records) == 1
    execution = {run.out.name: json.loads((run.out / "meta.json").read_text())["execution"] for run in runs}
    assert len({e["cache_tokens"] for e in execution.values()}) == 1         # one cache, whatever k
    assert {name: e["launches_counted_by"] for name, e in execution.items()} == {
        "none": "none", "a0.8": "a0.8", "a0.6": "a0.8"}
    assert execution["a0.6"]["launches_per_step"] == execution["a0.8"]["launches_per_step"] > 0
    assert all(e["kernel_variants_in_run"] == 0 and e["graph_captures_in_run"] == 0 for e in execution.values())


def test_a_run_that_fails_is_recorded_and_the_campaign_goes_on_then_exits_non_zero(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i % 97}" for i in range(3000)))
    campaign = tmp_path / "c.yaml"
    # The budget is checked against the prompt once it is tokenized: a failure inside the run.
    campaign.write_text("name: guard\ndefaults: {threads: 1, dtype: fp32, context: 64, batch: 1, limit: 1, "
                        "max_new_tokens: 2}\nruns:\n  - {name: first, method: none}\n"
                        "  - {name: broken, method: ngram, k: 2, budget: 4096}\n  - {name: last, method: none}\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "profiler", "campaign", str(campaign), "--text", str(text),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "1 of 3 runs failed (broken)" in proc.stderr.strip().splitlines()[-1]
    record = json.loads((out / "campaign.json").read_text())
    assert set(record["wall_s"]) == {"first", "last"}
    assert record["failed"] == {"broken": "InputError: --budget: 4096 is not below the context (64 prompt tokens)"}
    assert (out / "first" / "meta.json").is_file() and (out / "last" / "meta.json").is_file()
    assert not (out / "broken").exists()
