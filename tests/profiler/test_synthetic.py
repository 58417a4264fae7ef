"""The synthetic drafter (profiler/engine/synthetic.py): a set acceptance measured as set, on a
random-weight model, through the engine's own greedy (lossless) verification; divergence counted;
its flags' one-line errors; `sim validate` predicting its runs."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pd = pytest.importorskip("pandas")

from conftest import REPO  # noqa: E402
from profiler.engine.model import LlamaConfig  # noqa: E402
from profiler.engine.serving import speculative_generate  # noqa: E402
from profiler.engine.synthetic import (SyntheticDrafter, closed_form_tokens_per_step, draft_cost,  # noqa: E402
                                       position_rates, record_continuations)
from profiler.engine.tree import TreeShape  # noqa: E402

# 64 requests of 192 tokens at k = 4 commit 2.8-3.0 tokens a step: about 4,400 verification
# row-steps a run. Accepted drafts per step have a standard deviation of about 1.4 (one rate 0.7),
# so their mean is known to 1.4 / sqrt(4,400) = 0.021: 0.05 is 2.4 of those. A survival
# P(accepted >= j) near 0.5 is known to sqrt(0.25 / 4,400) = 0.0075: 0.03 is 4 of those, while an
# off-by-one (position j drafted from the record's token j + 1, or given rate a_(j+1)) moves it by
# 0.3 or more with the rates below.
REQUESTS, BATCH, NEW_TOKENS, K = 64, 16, 192, 4
TOKENS_PER_STEP_TOLERANCE, SURVIVAL_TOLERANCE = 0.05, 0.03
TINY = LlamaConfig(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256,
                   tied_embeddings=True, max_context=1024)


@pytest.fixture(scope="module")
def one_thread():
    # Forwards this small run fastest on one thread, and a second thread only contends on a busy machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(one_thread):
    """A random-weight Llama, its prompts, their autoregressive greedy outputs and records (k = 4)."""
    from profiler.engine.loaders import random_model

    model = random_model(TINY, torch.float32, "cpu", seed=0).model
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(0, TINY.vocab, int(rng.integers(8, 24)))] for _ in range(REQUESTS)]
    records = record_continuations(model, prompts, NEW_TOKENS, K, BATCH, eos_id=None)
    return model, prompts, records


def run_synthetic(model, prompts, drafter, tree=None):
    """(verification steps with request ids across batches, outputs) of static batches of BATCH."""
    steps, outputs = [], []
    for first in range(0, len(prompts), BATCH):
        generation = speculative_generate(model, prompts[first:first + BATCH], NEW_TOKENS, drafter, k=K, tree=tree)
        steps += [(first + s.request, s) for s in generation.steps if s.mode == "verify"]
        outputs += generation.outputs
    return steps, outputs


def survival(steps, depth: int) -> list[float]:
    """P(accepted >= j), j = 1..depth, over every verification row-step."""
    accepted = np.array([s.accepted for _, s in steps])
    return [float((accepted >= j).mean()) for j in range(1, depth + 1)]


def test_closed_form_and_rates_past_the_last():
    assert closed_form_tokens_per_step((0.7,), 4) == pytest.approx((1 - 0.7 ** 5) / (1 - 0.7))
    assert closed_form_tokens_per_step((0.9, 0.5, 0.8), 4) == pytest.approx(1 + 0.9 + 0.45 + 0.36 + 0.288)
    assert position_rates((0.9, 0.5), 4) == [0.9, 0.5, 0.5, 0.5]
    assert closed_form_tokens_per_step((1.0,), 5) == 6.0 and closed_form_tokens_per_step((0.0,), 5) == 1.0


def test_one_rate_commits_the_closed_forms_tokens_per_step_and_the_autoregressive_output(tiny):
    model, prompts, records = tiny
    drafter = SyntheticDrafter(records, (0.7,), TINY.vocab, seed=0)
    steps, outputs = run_synthetic(model, prompts, drafter)
    assert len(steps) >= 2000
    measured = 1 + np.mean([s.accepted for _, s in steps])         # before the last steps are cut
    assert measured == pytest.approx(closed_form_tokens_per_step((0.7,), K), abs=TOKENS_PER_STEP_TOLERANCE)
    # Greedy verification keeps the target's output: the same tokens as decoding one at a time.
    reference = []
    for first in range(0, REQUESTS, BATCH):
        reference += speculative_generate(model, prompts[first:first + BATCH], NEW_TOKENS, None).outputs
    assert outputs == reference
    assert drafter.summary(K)["diverged_requests"] == 0 and drafter.steps_after_divergence == 0


def test_per_position_rates_give_each_position_its_survival_and_fit_back(tiny):
    from sim.validate.fit_acceptance import fit_drafter
    from sim.validate.runs import LiveRun

    model, prompts, records = tiny
    rates = (0.9, 0.5, 0.8)                       # the fourth position takes the last rate, 0.8
    steps, _ = run_synthetic(model, prompts, SyntheticDrafter(records, rates, TINY.vocab, seed=3))
    expected = np.cumprod(position_rates(rates, K))                 # 0.9, 0.45, 0.36, 0.288
    assert survival(steps, K) == pytest.approx(list(expected), abs=SURVIVAL_TOLERANCE)
    assert 1 + np.mean([s.accepted for _, s in steps]) == pytest.approx(closed_form_tokens_per_step(rates, K),
                                                                         abs=TOKENS_PER_STEP_TOLERANCE)
    # `sim validate`'s fitted prediction reads the run's conditional rates back: the rates set.
    frame = pd.DataFrame([{"request": rid, "step": s.step, "mode": s.mode, "drafted": s.drafted,
                           "accepted": s.accepted} for rid, s in steps])
    requests = pd.DataFrame({"request": range(REQUESTS), "prompt_tokens": [len(p) for p in prompts]})
    args = {"method": "synthetic", "k": K, "tree": None, "max_new_tokens": NEW_TOKENS}
    run = LiveRun(REPO / "runs" / "x", {"arguments": args}, {"method": "synthetic"}, requests, frame)
    fitted = fit_drafter([run])["acceptance"]
    # Position 4 is reached by about 0.36 x 4,400 steps: its rate is known to about 0.01.
    assert fitted["per_position"] == pytest.approx(position_rates(rates, K), abs=0.04)
    assert fitted["request_spread"] < 0.05


def test_a_trees_other_branches_never_match_so_it_commits_the_chains_closed_form(tiny):
    model, prompts, records = tiny
    drafter = SyntheticDrafter(records, (0.7,), TINY.vocab, seed=5)
    steps, outputs = run_synthetic(model, prompts[:32], drafter, tree=TreeShape(3, K))
    assert all(s.drafted == 3 * K for _, s in steps)
    # Half the chain's row-steps: the mean is known to about 0.03.
    assert 1 + np.mean([s.accepted for _, s in steps]) == pytest.approx(closed_form_tokens_per_step((0.7,), K),
                                                                         abs=2 * TOKENS_PER_STEP_TOLERANCE)
    assert outputs == [records[tuple(p)][:NEW_TOKENS] for p in prompts[:32]]


def test_a_request_off_its_record_is_counted_and_its_drafts_rejected(tiny):
    model, prompts, records = tiny
    wrong = dict(records)
    off_at = 10                                   # the record says otherwise from output position 10 on
    truth = records[tuple(prompts[0])]
    wrong[tuple(prompts[0])] = truth[:off_at] + [(t + 1) % TINY.vocab for t in truth[off_at:]]
    drafter = SyntheticDrafter(wrong, (1.0,), TINY.vocab, seed=0)
    generation = speculative_generate(model, prompts[:BATCH], NEW_TOKENS, drafter, k=K)
    assert generation.outputs == [records[tuple(p)][:NEW_TOKENS] for p in prompts[:BATCH]]     # still lossless
    own = [s for s in generation.steps if s.request == 0]
    done = np.cumsum([1] + [s.committed for s in own])[:-1]          # output tokens when each step drafted
    after = [s for s, d in zip(own, done) if d > off_at]
    assert drafter.diverged_requests == 1 and drafter.steps_after_divergence == len(after) > 0
    assert all(s.accepted == 0 for s in after)
    # Every other request accepts all K drafts at every step, its last included (rate 1; the record
    # runs K tokens past the output's end).
    assert all(s.accepted == K for s in generation.steps if s.request != 0)


def test_a_head_shaped_draft_runs_its_forwards_and_shares_the_targets_lm_head(tiny):
    model, prompts, records = tiny
    cost = draft_cost("head", model, seed=1)
    assert len(cost.draft.layers) == 1 and cost.draft.lm_head is model.lm_head
    drafter = SyntheticDrafter(records, (0.8,), TINY.vocab, seed=0, cost=cost)
    generation = speculative_generate(model, prompts[:4], 24, drafter, k=K)
    assert generation.outputs == [records[tuple(p)][:24] for p in prompts[:4]]
    # The draft's own KV cache was filled by its prefill and steps.
    assert cost.draft.layers[0].attention.k_cache.abs().sum() > 0
    assert draft_cost("none", model, seed=1) is None
    with pytest.raises(ValueError, match="vocabulary 49152 differs from the target's 256"):
        draft_cost("smollm2-135m", model, seed=1)


def test_a_draft_preset_of_another_vocabulary_is_one_line_once_the_target_is_known(tiny, tmp_path):
    from profiler.live.config import LiveConfig
    from profiler.live.run import make_drafter
    from sim.errors import InputError

    settings = LiveConfig(method="synthetic", acceptance=(0.8,), draft_shape="smollm2-135m", out=tmp_path / "out")
    with pytest.raises(InputError, match="^--draft-shape: smollm2-135m's vocabulary 49152 differs from the target's 256$"):
        make_drafter(settings, tiny[0], torch.float32)
    # A campaign's YAML gives one rate as a number; the draft shape defaults to the head.
    assert LiveConfig(method="synthetic", acceptance=0.8, out=tmp_path / "o").acceptance == (0.8,)
    assert LiveConfig(method="synthetic", acceptance=0.8, out=tmp_path / "o").draft_shape == "head"


def test_validation_prices_a_synthetic_run_as_the_method_of_its_draft_cost(tmp_path):
    from sim.validate.compare import speculation_of
    from sim.validate.runs import LiveRun

    def spec(shape):
        args = {"method": "synthetic", "k": 5, "tree": None, "acceptance": [0.8], "draft_shape": shape}
        return speculation_of(LiveRun(tmp_path, {"arguments": args}, {"method": "synthetic"}, None, None),
                              {"rate": 0.8}, None)

    assert spec("head") == {"method": "eagle", "acceptance": {"rate": 0.8}, "draft": {"layers": 1},
                            "num_speculative_tokens": 5}
    assert spec("none") == {"method": "ngram", "acceptance": {"rate": 0.8}, "num_speculative_tokens": 5}
    assert spec("llama-3.2-1b")["method"] == "draft_model" and spec("llama-3.2-1b")["draft"] == {"model": "llama-3.2-1b"}


def test_a_live_synthetic_run_records_its_rates_and_is_replayed_and_fitted_by_sim_validate(tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("plotly")
    run = tmp_path / "runs" / "synthetic-b2"
    proc = subprocess.run([sys.executable, "-m", "profiler", "live", "--method", "synthetic", "--acceptance",
                           "0.9,0.6", "--draft-shape", "head", "--k", "3", "--batch", "2", "--limit", "2",
                           "--max-new-tokens", "8", "--threads", "1", "--check-lossless", "--out", str(run)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["method"] == "synthetic" and summary["lossless_mismatches"] == []
    assert summary["synthetic"]["acceptance"] == [0.9, 0.6, 0.6]
    assert summary["synthetic"]["closed_form_tokens_per_step"] == pytest.approx(1 + 0.9 + 0.54 + 0.324)
    assert summary["synthetic"]["diverged_requests"] == 0       # fp32 on the CPU: the record is the output
    assert json.loads((run / "meta.json").read_text())["arguments"]["draft_shape"] == "head"
    # A second run of the same drafter (a copy) gives the first one's fitted prediction.
    shutil.copytree(run, tmp_path / "runs" / "synthetic-b2-again")
    out = tmp_path / "validation"
    proc = subprocess.run([sys.executable, "-m", "sim", "validate", str(tmp_path / "runs"), "--calibration",
                           "calibration/cpu/smollm2-135m", "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.read_csv(out / "validation.csv", comment="#")
    assert set(rows.prediction) == {"replay", "fitted"} and set(rows.method) == {"synthetic"}
    replay = rows[rows.prediction == "replay"].iloc[0]
    assert replay.predicted_tokens_per_step == pytest.approx(replay.measured_tokens_per_step)
    assert np.isfinite(rows.predicted_speedup).all() and (rows.predicted_tok_s > 0).all()
