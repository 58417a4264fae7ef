"""SpecPV's bookkeeping in the simulated engine (sim/specpv.py), without the pipeline: which rows of a
step verify plainly, against their partial KV (sink + budget + window + the buffer accepted since
the refresh) or fully (re-feeding the buffer and re-selecting blocks), when the full-verify period
is reached, what such a step is priced, and the accounting after it (buffers, partial tokens,
expected divergence, rectify's roll-back and last check)."""
import numpy as np
import pytest

from conftest import UNIT_ENGINE, UNIT_HARDWARE
from sim.cost.batch import FULL, PARTIAL, PHASES, SELECTION, VERIFY, prefill_group
from sim.cost.memory import plan_memory
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.cost.work import Selection
from sim.result import RunRecord
from sim.scenario.load import load_scenario
from sim.scenario.speculation import Disagreement, PartialVerify
from sim.slots import DecodeSlots
from sim.specpv import (account_partial_verify, disagreement_probability, hold_last_check, plan_partial_verify,
                        unchecked_divergence)
from sim.step import plan_step, price, step_config

V = 4                   # tokens a row verifies: 3 drafts and the last committed token
TARGET = "target"       # the target's pricer, which plan_partial_verify only hands on to the selection


def select(requests: int, context_sum: int, query_tokens_sum: int, part: str) -> Selection:
    """The block selection plan_partial_verify asks of the target at partial_verify()'s budget and block."""
    return Selection(pricer=TARGET, requests=requests, context_sum=context_sum, query_tokens_sum=query_tokens_sum,
                     budget_tokens=64, block_tokens=16, part=part)


def partial_verify(**fields) -> PartialVerify:
    """Sink 4 + budget 64 + window 8: 76 tokens of partial cache besides the buffer; a period of 6."""
    return PartialVerify(**{"budget": 64, "sink": 4, "window": 8, "block": 16, "period": 6, **fields})


def slots_of(ctx, since=0, steps_since=0, selected=1, steps=0) -> DecodeSlots:
    """Decoding rows of these contexts, each with its SpecPV state (request ids 10, 11, ...)."""
    n = len(ctx)
    slots = DecodeSlots(n)
    slots.hold(ctx)
    slots.rid[:n] = np.arange(10, 10 + n)
    slots.since[:n], slots.steps_since[:n], slots.selected[:n], slots.steps[:n] = since, steps_since, selected, steps
    return slots


def plan(pv, slots, pad_ragged=False, groups=None):
    """plan_partial_verify over every row of `slots`, each attending to its own context."""
    n = slots.n
    groups = [] if groups is None else groups
    ctx = slots.ctx[:n]
    selections, full, partial = plan_partial_verify(pv, TARGET, V, pad_ragged, slots, n, ctx, ctx, groups)
    return groups, selections, full, partial


def record() -> RunRecord:
    empty = np.zeros(0)
    return RunRecord(first_token_s=empty, finish_s=empty, arrival_s=empty, output_tokens=empty)


def account(pv, slots, committed, full, partial, rec, rolled_back=None, seed=0):
    return account_partial_verify(pv, slots, slots.n, np.asarray(committed), full, partial, rec, rolled_back,
                                  np.random.default_rng(seed))


def test_a_context_within_sink_budget_and_window_verifies_plainly_against_all_of_it():
    # Neither row has a selection, but 76 tokens fit the partial cache whole: nothing to select.
    groups, selections, full, partial = plan(partial_verify(), slots_of([50, 76], selected=0))
    (plain,) = groups
    assert (plain.phase, plain.requests, plain.tokens, plain.kv_tokens_sum) == (VERIFY, 2, 2 * V, 53 + 79)
    assert list(plain.kv_tokens) == [53, 79]
    assert selections == [] and not full.any() and not partial.any()


def test_a_row_without_a_selection_verifies_fully_and_selects_its_blocks():
    groups, selections, full, partial = plan(partial_verify(), slots_of([1000], selected=0))
    (g,) = groups
    assert (g.phase, g.tokens, g.query_max, g.kv_tokens_sum, g.logits_tokens) == (FULL, V, V, 1003, V)
    assert selections == [select(1, 1003, V, "refresh")]
    assert list(full) == [True] and list(partial) == [False]


def test_a_partial_row_reads_sink_budget_window_and_its_buffer_instead_of_its_context():
    groups, selections, full, partial = plan(partial_verify(), slots_of([1000, 2000], since=[2, 5]))
    (g,) = groups
    # 4 + 64 + 8 static tokens, the buffer, and the V tokens verified.
    assert (g.phase, g.requests, g.tokens, g.kv_tokens_sum) == (PARTIAL, 2, 2 * V, (76 + 2 + V) + (76 + 5 + V))
    assert list(g.kv_tokens) == [82, 85]
    assert selections == []                    # SpecPV selects at the refresh, not at partial steps
    assert list(partial) == [True, True] and not full.any()


def test_a_full_verification_re_feeds_the_buffer_accepted_since_the_refresh():
    groups, selections, _, _ = plan(partial_verify(), slots_of([1000], since=6))
    (g,) = groups
    assert (g.phase, g.tokens, g.query_max, g.kv_tokens_sum, g.logits_tokens) == (FULL, 6 + V, 6 + V, 1003, 6 + V)
    assert selections == [select(1, 1003, 6 + V, "refresh")]


@pytest.mark.parametrize("since, mode", [(0, PARTIAL), (5, PARTIAL), (6, FULL), (9, FULL)])
def test_the_full_verify_period_in_tokens_is_reached_at_period_tokens_since_the_refresh(since, mode):
    groups, _, full, partial = plan(partial_verify(period=6), slots_of([1000], since=since, steps_since=1))
    assert [g.phase for g in groups] == [mode]
    assert (bool(full[0]), bool(partial[0])) == (mode == FULL, mode == PARTIAL)


@pytest.mark.parametrize("steps_since, mode", [(1, PARTIAL), (2, PARTIAL), (3, FULL)])
def test_the_full_verify_period_in_steps_counts_partial_steps_not_tokens(steps_since, mode):
    pv = partial_verify(period=3, period_unit="steps")
    groups, _, _, _ = plan(pv, slots_of([1000], since=100, steps_since=steps_since))
    assert [g.phase for g in groups] == [mode]


def test_rows_of_one_step_split_into_plain_partial_and_full_groups():
    slots = slots_of([50, 1000, 2000, 3000], since=[0, 3, 6, 0], selected=[0, 1, 1, 0])
    groups, selections, full, partial = plan(partial_verify(), slots)
    assert [(g.phase, g.requests) for g in groups] == [(VERIFY, 1), (PARTIAL, 1), (FULL, 2)]
    assert list(full) == [False, False, True, True] and list(partial) == [False, True, False, False]
    refresh = groups[2]
    assert list(refresh.query_tokens) == [6 + V, V] and list(refresh.kv_tokens) == [2003, 3003]
    assert (refresh.tokens, refresh.query_max, refresh.logits_tokens) == (14, 10, 14)
    assert selections == [select(2, 5000 + 2 * (V - 1), 14, "refresh")]


def test_quest_scores_blocks_at_every_partial_step_and_a_refresh_only_takes_block_summaries():
    slots = slots_of([50, 1000, 2000, 3000], since=[0, 3, 6, 0], selected=[0, 1, 1, 0])
    _, selections, _, _ = plan(partial_verify(reselect="step"), slots)
    assert selections == [select(1, 1000, V, "scores"), select(2, 5006, 14, "summaries")]


def test_a_static_shape_engine_runs_the_steps_rows_at_the_longest_re_feed_but_leaves_the_prompt_chunk():
    chunk = prefill_group([20], [30], 0)
    slots = slots_of([50, 1000, 2000], since=[0, 3, 6], selected=[0, 1, 1])
    groups, _, _, _ = plan(partial_verify(), slots, pad_ragged=True, groups=[chunk])
    assert groups[0] is chunk
    # The refresh re-feeds 6 + 4 tokens: every row of this step runs 10.
    assert [(g.phase, g.tokens, g.query_max) for g in groups[1:]] == [(VERIFY, 10, 10), (PARTIAL, 10, 10),
                                                                     (FULL, 10, 10)]
    assert list(groups[3].query_tokens) == [10]
    # Without a refresh in the step every row verifies its own V tokens.
    groups, _, _, _ = plan(partial_verify(), slots_of([50, 1000], since=[0, 3], selected=[0, 1]), pad_ragged=True)
    assert [g.tokens for g in groups] == [V, V]


def test_a_specpv_step_prices_partial_rows_over_their_partial_kv_and_a_refresh_with_its_selection(tiny_config):
    """The tiny model on UNIT_HARDWARE (test_step.py's roofline): one target forward of T tokens with
    logits reading K KV tokens costs (368 + 300 T + 8 K) / 1e9 s; the block selection reads the
    blocks' key max and min and copies the budget's K and V, 8 bytes a token each."""
    scenario = load_scenario({
        "hardware": UNIT_HARDWARE, "engine": UNIT_ENGINE, "model": str(tiny_config),
        "workload": {"concurrency": 1, "requests": 1, "prompt_tokens": 8, "output_tokens": 8},
        "speculation": {"method": "ngram", "num_speculative_tokens": 3, "acceptance": {"rate": 0.5},
                        "partial_verify": {"budget": 64, "sink": 4, "window": 8, "block": 16, "period": 6}}})
    stacks = build_stacks(scenario)
    cost = cost_model_for(scenario)
    config = step_config(scenario, stacks, plan_memory(scenario, stacks, 4096, 4), cost, speculative=True)
    slots = slots_of([1000, 2000, 3005], since=[2, 5, 0], selected=[1, 1, 0])
    steps = plan_step(config, config.full, slots, 3)
    assert list(steps.partial) == [True, True, False] and list(steps.full) == [False, False, True]
    shares = [0.0] * len(PHASES)
    seconds = price(steps, cost, shares)
    # Partial rows read 82 and 85 KV tokens, not 1003 and 2003; the refresh reads 3008.
    forward = (368 + 300 * 12 + 8 * (82 + 85 + 3008)) / 1e9
    # The weights and every token's work split 8 : 4 by query (and logits) tokens; KV is each group's own.
    shared = 368 + 300 * 12 - 16 * 12            # attention's query bytes are each group's own too
    assert shares[PARTIAL] == pytest.approx((shared * 8 / 12 + 16 * 8 + 8 * 167) / 1e9, rel=1e-12)
    assert shares[FULL] == pytest.approx((shared * 4 / 12 + 16 * 4 + 8 * 3008) / 1e9, rel=1e-12)
    # Selection over 3008 tokens: 188 blocks x 2 summaries x 8 bytes, then 2 x 64 x 8 bytes copied.
    selection = (2 * 188 * 8 + 2 * 64 * 8) / 1e9
    assert shares[SELECTION] == pytest.approx(selection, rel=1e-12)
    assert seconds == pytest.approx(forward + selection, rel=1e-12)


@pytest.mark.parametrize("unit, period, modes", [
    ("tokens", 6, "FPPPFPPPF"),        # 2 tokens a step: 6 after three partial steps
    ("steps", 2, "FPPFPPFPP"),
])
def test_a_request_refreshes_once_its_period_is_reached_and_verifies_partially_between(unit, period, modes):
    pv = partial_verify(period=period, period_unit=unit)
    slots, rec = slots_of([1000], selected=0), record()
    seen = ""
    for _ in modes:
        _, _, full, partial = plan(pv, slots)
        seen += "F" if full[0] else "P" if partial[0] else "-"
        account(pv, slots, [2], full, partial, rec)
    assert seen == modes
    assert (rec.full_verifications, rec.partial_steps) == (modes.count("F"), modes.count("P"))
    assert rec.partial_accepted_tokens == 2 * modes.count("P")


def test_partial_rows_add_what_they_commit_to_their_buffer_and_may_differ_from_full_attention():
    # p = 0.01 x (128 / 64) x (context / 1000) ^ 0.5: 0.02 at 1,000 tokens, 0.04 at 4,000.
    pv = partial_verify(disagreement=Disagreement(per_token=0.01, at_budget=128, at_context=1000))
    slots, rec = slots_of([1000, 4000], since=[1, 2], steps_since=[1, 1]), record()
    _, _, full, partial = plan(pv, slots)
    kept = account(pv, slots, [3, 2], full, partial, rec)
    assert list(kept) == [3, 2]
    assert list(slots.since[:2]) == [4, 4] and list(slots.steps_since[:2]) == [2, 2]
    assert (rec.partial_accepted_tokens, rec.partial_steps, rec.full_verifications) == (5, 2, 0)
    assert rec.divergent_tokens == pytest.approx(0.02 * 3 + 0.04 * 2, rel=1e-12)


def test_a_full_verification_empties_the_buffer_and_keeps_its_selection():
    pv = partial_verify(disagreement=Disagreement(per_token=0.5))
    slots, rec = slots_of([1000, 2000], since=[6, 0], steps_since=[3, 0], selected=[1, 0]), record()
    _, _, full, partial = plan(pv, slots)
    kept = account(pv, slots, [4, 2], full, partial, rec)
    assert list(kept) == [4, 2]                # without rectify, nothing is rolled back
    assert list(slots.since[:2]) == [0, 0] and list(slots.steps_since[:2]) == [0, 0]
    assert list(slots.selected[:2]) == [1, 1]
    assert (rec.full_verifications, rec.partial_steps, rec.divergent_tokens, rec.rolled_back_tokens) == (2, 0, 0.0, 0)


def test_rectify_rolls_back_a_replayed_runs_own_disagreements_and_keeps_the_targets_token():
    pv = partial_verify(rectify=True)
    slots, rec = slots_of([1000, 2000, 3000], since=[5, 5, 3], selected=0, steps=[5, 6, 7]), record()
    asked = []

    def rolled_back(rids, steps):
        asked.append((list(rids), list(steps)))
        return np.array([2, 0, 7])

    _, _, full, partial = plan(pv, slots)
    kept = account(pv, slots, [4, 4, 4], full, partial, rec, rolled_back)
    assert asked == [([10, 11, 12], [4, 5, 6])]        # the step just verified
    # Rows 1 and 3 drop 2 and (at most their buffer) 3 tokens and this step's drafts, keeping the
    # target's token in their place; row 2 disagrees nowhere and keeps its 4.
    assert list(kept) == [1 - 2, 4, 1 - 3]
    assert rec.rolled_back_tokens == 5
    assert list(slots.since[:3]) == [0, 0, 0]


def test_rectify_rolls_back_the_whole_buffer_where_every_token_disagrees():
    pv = partial_verify(rectify=True, disagreement=Disagreement(per_token=1.0))
    slots, rec = slots_of([1000, 2000], since=[5, 3], selected=0), record()
    _, _, full, partial = plan(pv, slots)
    assert list(account(pv, slots, [4, 4], full, partial, rec)) == [1 - 5, 1 - 3]
    assert rec.rolled_back_tokens == 8


def test_rectifys_first_disagreement_in_the_buffer_is_geometric_in_the_disagreement_probability():
    pv = partial_verify(rectify=True, disagreement=Disagreement(per_token=0.1, at_budget=64, context_exponent=0.0))
    n = 20_000
    slots, rec = slots_of(np.full(n, 5000), since=1000, selected=0), record()
    _, _, full, partial = plan(pv, slots)
    kept = account(pv, slots, np.full(n, 4), full, partial, rec)
    assert kept.max() <= 1               # 1,000 tokens without a disagreement: 0.9 ^ 1000, never
    good = 1000 - (1 - kept)             # tokens of the buffer before the first disagreement
    # Geometric with p = 0.1: P(0 good) = 0.1, mean (1 - p) / p = 9.
    assert np.mean(good == 0) == pytest.approx(0.1, abs=0.01)
    assert good.mean() == pytest.approx(9.0, abs=0.3)
    assert rec.rolled_back_tokens == (1000 - good).sum()


def test_hold_last_check_holds_done_rows_with_unchecked_tokens_for_one_more_full_verification():
    slots = slots_of([1000, 2000, 3000], since=[0, 3, 2])
    done = hold_last_check(slots, 3, np.array([True, True, False]))
    assert list(done) == [True, False, False]
    assert list(slots.selected[:3]) == [1, 0, 1] and list(slots.final[:3]) == [0, 1, 0]


def test_a_requests_last_check_commits_nothing_new_where_nothing_disagrees():
    pv = partial_verify(rectify=True)
    slots, rec = slots_of([1000, 2000], since=[3, 3]), record()
    hold_last_check(slots, 2, np.array([True, True]))
    _, _, full, partial = plan(pv, slots)
    assert list(full) == [True, True]
    kept = account(pv, slots, [4, 4], full, partial, rec, lambda rids, steps: np.array([0, 2]))
    # The first is done and checked; the second replaces its second-last unchecked token and goes on.
    assert list(kept) == [0, 1 - 2]
    assert list(slots.final[:2]) == [0, 0] and rec.rolled_back_tokens == 2


def test_disagreement_follows_its_power_law_clipped_to_one_and_is_zero_within_the_partial_cache():
    d = Disagreement(per_token=0.01, at_budget=4096, at_context=32768, budget_exponent=1.0, context_exponent=0.5)
    p = disagreement_probability(d, 1024, 2000, np.array([1500, 2000, 2001, 8192, 131072, 10 ** 9]))
    # (4096 / 1024) = 4 at the budget; (8192 / 32768) ^ 0.5 = 0.5, (131072 / 32768) ^ 0.5 = 2.
    assert p[:2].tolist() == [0.0, 0.0]
    assert p[2:5] == pytest.approx([0.04 * (2001 / 32768) ** 0.5, 0.02, 0.08], rel=1e-12)
    assert p[5] == 1.0


def test_unchecked_divergence_is_the_expected_disagreements_among_tokens_never_re_checked():
    pv = partial_verify(disagreement=Disagreement(per_token=0.01, at_budget=128, at_context=1000))
    assert unchecked_divergence(pv, np.array([10, 5, 7]), np.array([1000, 4000, 76])) == \
        pytest.approx(10 * 0.02 + 5 * 0.04 + 0, rel=1e-12)
