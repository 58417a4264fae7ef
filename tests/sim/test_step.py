"""One engine step planned and priced (sim/step.py) on cases priced by hand: what `plan_step` runs
(host work, prompt chunks, the drafter's forwards, the target's one forward) and what `price`
charges for it, chains, trees, prompt lookup, Medusa, a drafter with its own KV, ragged and padded
rows, and goodput's candidates (`price_decode_steps`), without the pipeline around them."""
import numpy as np
import pytest

from conftest import UNIT_ENGINE, UNIT_HARDWARE
from sim.cost.batch import DECODE, DRAFT, OVERHEAD, PHASES, PREFILL, VERIFY, prefill_group, uniform_group
from sim.cost.memory import plan_memory
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.scenario.load import load_scenario
from sim.slots import DecodeSlots
from sim.cost.work import Forward, HostDraft, SpeculationHost, StepHost, Subtotal, UniformForward
from sim.step import (StepShape, decode_tokens, plan_step, price, price_decode_steps, row_verify_tokens,
                      step_config)

# UNIT_ENGINE's host work is nil but for the vLLM preset's drafting floor, zeroed here too. HOST
# gives every host term a value of its own, so a term charged once too often or too rarely shows.
NO_HOST = {**UNIT_ENGINE, "draft_forward_overhead_s": 0.0, "speculation_step_overhead_s": 0.0,
           "speculation_request_overhead_s": 0.0}
HOST = {**UNIT_ENGINE, "step_overhead_s": 1e-3, "request_overhead_s": 1e-4, "speculation_step_overhead_s": 3e-5,
        "speculation_request_overhead_s": 2e-6, "draft_forward_overhead_s": 5e-7, "ngram_lookup_s": 7e-8}

# The tiny model (conftest's tiny_config: 1 layer, hidden 4, 2 query heads and 1 KV head of dim 2,
# FFN 8, tied vocabulary 10, bf16) on UNIT_HARDWARE (1 GB/s, 1 TFLOP/s) is memory-bound in every
# operator at these sizes, so a forward of T query tokens, L of them with logits, reading K KV tokens
# in all costs (weights + per_token x T + LM head + 8 K) / 1e9 s, where
#   weights: the layer's linears, 144 parameters (qkv 4x8, o 4x4, gate_up 4x16, down 8x4) at 2 bytes;
#   per_token: their activations 2 x (12 + 8 + 20 + 12) = 104, elementwise 2 x (10 x 4 + 2 x 3 x 2 +
#     3 x 8) = 152, attention's query read and output written 2 x 2 heads x 2 dims x 2 = 16;
#   LM head: 40 weights x 2 bytes, and 2 x (4 + 10) = 28 a logits token (nothing without logits);
#   8: the K and V of one KV token (1 head x 2 dims x 2 x 2 bytes).
TARGET = {"weights": 288, "per_token": 272}
SHADOW = {"weights": 144 * (0.5 + 4 / 64), "per_token": 272}    # int4, a 16-bit scale and zero per 64
EAGLE = {"weights": 288 + 64, "per_token": 272 + 24}            # + the fusion linear 8x4
CONTEXTS = [100, 200, 300]
N, CTX_SUM = len(CONTEXTS), sum(CONTEXTS)


def forward_s(tokens, logits, kv, weights, per_token):
    lm_head = 80 + 28 * logits if logits else 0
    return (weights + per_token * tokens + lm_head + 8 * kv) / 1e9


def chain_drafts_s(k, n, ctx_sum, stack=SHADOW):
    """k sequential draft forwards of one token a row, forward j reading j drafts besides the context."""
    return sum(forward_s(n, n, ctx_sum + n * j, **stack) for j in range(k))


def host_s(requests):
    return HOST["step_overhead_s"] + requests * HOST["request_overhead_s"]


def speculation_host_s(requests, draft_forwards):
    return (HOST["speculation_step_overhead_s"] + requests * HOST["speculation_request_overhead_s"]
            + draft_forwards * HOST["draft_forward_overhead_s"])


def kinds(plan) -> list[type]:
    return [type(item) for item in plan]


def unit_steps(tiny_config, speculation=None, engine=NO_HOST, scheduler=None, hardware=UNIT_HARDWARE, **step_fields):
    """The tiny model's cost model and step configuration (speculative where `speculation` is given)."""
    fields = {"hardware": hardware, "engine": engine, "model": str(tiny_config),
              "workload": {"concurrency": 1, "requests": 1, "prompt_tokens": 8, "output_tokens": 8}}
    if speculation is not None:
        fields["speculation"] = {"acceptance": {"rate": 0.5}, **speculation}
    if scheduler is not None:
        fields["scheduler"] = scheduler
    scenario = load_scenario(fields)
    stacks = build_stacks(scenario)
    cost = cost_model_for(scenario)
    config = step_config(scenario, stacks, plan_memory(scenario, stacks, 1024, 4), cost,
                         speculative=speculation is not None, **step_fields)
    return cost, config


def held(contexts=CONTEXTS):
    slots = DecodeSlots(8)
    slots.hold(contexts)
    return slots


def priced(plan, cost):
    """The plan's seconds and the shares they went to."""
    shares = [0.0] * len(PHASES)
    return price(plan, cost, shares), shares


def test_a_step_without_speculation_is_one_target_decode_forward_over_its_n_rows(tiny_config):
    cost, config = unit_steps(tiny_config)
    plan = plan_step(config, config.shape(0), held(), N)
    assert kinds(plan) == [StepHost, UniformForward]
    assert plan[0] == StepHost(requests=N, verify_tokens=1)
    decode = plan[1]
    assert (decode.pricer, decode.phase, decode.requests, decode.query, decode.kv_tokens_sum) == \
        (config.target, DECODE, N, 1, CTX_SUM)
    seconds, shares = priced(plan, cost)
    # 3 tokens, each with logits, reading the 600 tokens of context.
    assert seconds == pytest.approx(forward_s(3, 3, 600, **TARGET), rel=1e-12)
    assert shares[DECODE] == pytest.approx(seconds, rel=1e-12) and sum(shares) == pytest.approx(seconds, rel=1e-12)


def test_a_steps_host_work_is_the_presets_per_step_time_and_per_request_time(tiny_config):
    cost, config = unit_steps(tiny_config, engine=HOST)
    seconds, shares = priced(plan_step(config, config.shape(0), held(), N), cost)
    assert shares[OVERHEAD] == pytest.approx(1e-3 + 3 * 1e-4, rel=1e-12)
    assert seconds == pytest.approx(1e-3 + 3 * 1e-4 + forward_s(3, 3, 600, **TARGET), rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_chain_of_k_prices_k_draft_forwards_and_one_verification_of_k_plus_1_tokens_a_row(tiny_config, k):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 4}, engine=HOST)
    plan = plan_step(config, config.shape(k), held(), N)
    assert plan[0] == StepHost(requests=N, verify_tokens=k + 1)
    assert plan[-2] == SpeculationHost(requests=N, draft_forwards=k)
    verify = plan[-1]
    assert isinstance(verify, UniformForward)
    assert (verify.pricer, verify.phase, verify.requests, verify.query) == (config.target, VERIFY, N, k + 1)
    assert verify.kv_tokens_sum == CTX_SUM + N * k             # the last verified token reads the context and k drafts
    seconds, shares = priced(plan, cost)
    drafts = chain_drafts_s(k, N, CTX_SUM)
    verification = forward_s(N * (k + 1), N * (k + 1), CTX_SUM + N * k, **TARGET)
    assert shares[DRAFT] == pytest.approx(drafts + k * HOST["draft_forward_overhead_s"], rel=1e-12)
    assert shares[VERIFY] == pytest.approx(verification, rel=1e-12)
    assert shares[OVERHEAD] == pytest.approx(host_s(N) + speculation_host_s(N, 0), rel=1e-12)
    assert seconds == pytest.approx(host_s(N) + drafts + speculation_host_s(N, k) + verification, rel=1e-12)


def test_a_speculative_configurations_step_at_k_0_drafts_nothing_and_decodes_one_token_a_row(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 4}, engine=HOST)
    plan = plan_step(config, config.shape(0), held(), N)
    assert kinds(plan) == [StepHost, UniformForward] and plan[1].phase == DECODE
    seconds, shares = priced(plan, cost)
    assert shares[DRAFT] == 0.0
    assert seconds == pytest.approx(host_s(N) + forward_s(3, 3, 600, **TARGET), rel=1e-12)


def test_step_shapes_cut_a_chain_at_k_and_draft_a_tree_whole(tiny_config):
    _, chain = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3})
    assert chain.shapes == tuple(StepShape(k, k > 0, k + 1, k) for k in range(4))
    assert chain.full == StepShape(3, True, 4, 3) and chain.verify_tokens == 4
    _, tree = unit_steps(tiny_config, {"method": "shadow", "tree": {"width": 2, "depth": 3}})
    # A tree of 2 x 3 drafts verifies its 6 nodes and the last committed token at every drafting k.
    assert [(s.k, s.drafting, s.verify_tokens) for s in tree.shapes] == [(0, False, 1), (1, True, 7), (2, True, 7),
                                                                         (3, True, 7)]
    assert tree.full == StepShape(3, True, 7, 3) and tree.tree_width == 2
    _, baseline = unit_steps(tiny_config)
    assert baseline.shapes == (StepShape(0, False, 1, 0),) and baseline.full == StepShape(0, False, 1, 0)


def test_a_tree_drafts_depth_forwards_of_width_tokens_and_verifies_every_node(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "tree": {"width": 2, "depth": 3}})
    seconds, shares = priced(plan_step(config, config.full, held(), N), cost)
    # The first forward drafts level 1 from the last token; forwards 2 and 3 each take the 2 tokens
    # of a level, reading the 2 and 4 drafted before them (3 in the mean).
    drafts = forward_s(N, N, CTX_SUM, **SHADOW) + 2 * forward_s(2 * N, 2 * N, CTX_SUM + 3 * N, **SHADOW)
    verification = forward_s(7 * N, 7 * N, CTX_SUM + 6 * N, **TARGET)
    assert shares[DRAFT] == pytest.approx(drafts, rel=1e-12)
    assert shares[VERIFY] == pytest.approx(verification, rel=1e-12)
    assert seconds == pytest.approx(drafts + verification, rel=1e-12)


def test_a_drafter_with_its_own_kv_first_catches_up_on_the_tokens_the_last_step_committed(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "eagle", "num_speculative_tokens": 3}, engine=HOST)
    assert config.track_last
    slots = held()
    slots.last[:N] = (3, 1, 2)           # what the previous step committed, row by row
    slots.last_sum = 6
    seconds, shares = priced(plan_step(config, config.full, slots, N), cost)
    # The head's first forward takes the 6 committed tokens (logits for one a row); its other two
    # draft one token a row, reading 1 and 2 drafts besides the context.
    drafts = (forward_s(6, N, CTX_SUM, **EAGLE)
              + chain_drafts_s(3, N, CTX_SUM, EAGLE) - chain_drafts_s(1, N, CTX_SUM, EAGLE))
    verification = forward_s(4 * N, 4 * N, CTX_SUM + 3 * N, **TARGET)
    assert shares[DRAFT] == pytest.approx(drafts + 3 * HOST["draft_forward_overhead_s"], rel=1e-12)
    assert seconds == pytest.approx(host_s(N) + drafts + speculation_host_s(N, 3) + verification, rel=1e-12)


def test_a_drafter_with_its_own_kv_reads_the_input_token_at_a_step_that_drafts_nothing(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "eagle", "num_speculative_tokens": 3})
    plan = plan_step(config, config.shape(0), held(), N)
    assert kinds(plan) == [StepHost, UniformForward, UniformForward]
    assert plan[1].pricer is config.draft and plan[2].pricer is config.target
    seconds, shares = priced(plan, cost)
    # The head takes one token a row over the context, without logits (it proposes nothing).
    assert shares[DRAFT] == pytest.approx(forward_s(N, 0, CTX_SUM, **EAGLE), rel=1e-12)
    assert shares[DECODE] == pytest.approx(forward_s(N, N, CTX_SUM, **TARGET), rel=1e-12)
    assert seconds == pytest.approx(shares[DRAFT] + shares[DECODE], rel=1e-12)


def test_prompt_lookup_drafts_on_the_host_one_lookup_a_row_and_runs_no_draft_forward(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "ngram", "num_speculative_tokens": 3}, engine=HOST)
    plan = plan_step(config, config.full, held(), N)
    assert kinds(plan) == [StepHost, HostDraft, SpeculationHost, UniformForward]
    assert plan[1] == HostDraft(requests=N, context_tokens=CTX_SUM / N)      # the mean history a lookup searches
    assert plan[2] == SpeculationHost(requests=N, draft_forwards=0)
    seconds, shares = priced(plan, cost)
    assert shares[DRAFT] == pytest.approx(N * HOST["ngram_lookup_s"], rel=1e-12)
    verification = forward_s(4 * N, 4 * N, CTX_SUM + 3 * N, **TARGET)
    assert seconds == pytest.approx(host_s(N) + N * HOST["ngram_lookup_s"] + speculation_host_s(N, 0) + verification,
                                    rel=1e-12)


def test_medusa_drafts_every_position_in_one_forward_of_its_heads(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "medusa", "num_speculative_tokens": 3}, engine=HOST)
    plan = plan_step(config, config.full, held(), N)
    assert kinds(plan) == [StepHost, UniformForward, SpeculationHost, UniformForward]
    assert plan[1].repeat == 1 and plan[2] == SpeculationHost(requests=N, draft_forwards=1)     # one forward, whatever k
    seconds, shares = priced(plan, cost)
    # No decoder layer and no attention: 3 residual blocks 4x4 (32 weight bytes, 16 a token each)
    # and 3 LM heads, one vocabulary of 30 (240 weight bytes, 2 x (4 + 30) = 68 a logits token).
    heads = (3 * 32 + 3 * 16 * N + 240 + 68 * N) / 1e9
    assert shares[DRAFT] == pytest.approx(heads + HOST["draft_forward_overhead_s"], rel=1e-12)
    verification = forward_s(4 * N, 4 * N, CTX_SUM + 3 * N, **TARGET)
    assert seconds == pytest.approx(host_s(N) + heads + speculation_host_s(N, 1) + verification, rel=1e-12)


def test_prompt_chunks_ride_in_the_decode_rows_target_forward(tiny_config):
    cost, config = unit_steps(tiny_config)
    # Request 7 has 10 of its 50 prompt tokens and takes 20 more; request 8 finishes its 40.
    chunks = [([7, 10, 50], 20), ([8, 30, 40], 10)]
    plan = plan_step(config, config.shape(0), held(), N, chunks)
    assert kinds(plan) == [StepHost, Forward]
    assert plan[0] == StepHost(requests=N + 2, verify_tokens=1)
    prefill, decode = plan[1].groups
    assert (prefill.phase, prefill.requests, prefill.tokens, prefill.kv_tokens_sum, prefill.logits_tokens) == \
        (PREFILL, 2, 30, 30 + 40, 1)               # logits for the last token of the finished prompt only
    assert (decode.phase, decode.requests, decode.tokens, decode.kv_tokens_sum) == (DECODE, N, N, CTX_SUM)
    seconds, shares = priced(plan, cost)
    # One forward of 33 tokens pays the weights once; its shared work splits by query tokens.
    assert seconds == pytest.approx(forward_s(33, 1 + N, 70 + CTX_SUM, **TARGET), rel=1e-12)
    prefill_share = ((288 + 256 * 33) * 30 / 33 + 16 * 30 + 8 * 70 + (80 + 28 * 4) * 1 / 4) / 1e9
    assert shares[PREFILL] == pytest.approx(prefill_share, rel=1e-12)
    assert shares[DECODE] == pytest.approx(seconds - prefill_share, rel=1e-12)


def test_prompt_chunks_of_a_step_without_decoding_rows_are_one_target_forward(tiny_config):
    cost, config = unit_steps(tiny_config, engine=HOST)
    plan = plan_step(config, config.shape(0), held([]), 0, [([7, 0, 20], 20), ([8, 0, 64], 16)])
    assert kinds(plan) == [StepHost, Forward] and plan[0] == StepHost(requests=2, verify_tokens=1)
    seconds, _ = priced(plan, cost)
    assert seconds == pytest.approx(host_s(2) + forward_s(36, 1, 36, **TARGET), rel=1e-12)


def test_per_request_prefill_runs_each_prompt_chunk_as_a_target_forward_of_its_own(tiny_config):
    cost, config = unit_steps(tiny_config, scheduler={"prefill_forward": "per_request"})
    plan = plan_step(config, config.shape(0), held(), N, [([7, 10, 50], 20), ([8, 30, 40], 10)])
    assert kinds(plan) == [StepHost, Forward, Forward, UniformForward]
    seconds, _ = priced(plan, cost)
    # Three forwards, each reading the weights.
    expected = forward_s(20, 0, 30, **TARGET) + forward_s(10, 1, 40, **TARGET) + forward_s(N, N, CTX_SUM, **TARGET)
    assert seconds == pytest.approx(expected, rel=1e-12)


def test_a_drafter_with_its_own_kv_prefills_every_prompt_chunk_too(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "eagle", "num_speculative_tokens": 3})
    plan = plan_step(config, config.full, held([]), 0, [([7, 30, 50], 20)])
    assert kinds(plan) == [StepHost, Forward, Forward]
    assert plan[1].pricer is config.draft and plan[2].pricer is config.target
    seconds, shares = priced(plan, cost)
    # The chunk ends the prompt: the target computes the logits of its last token, the head none.
    head, target = forward_s(20, 0, 50, **EAGLE), forward_s(20, 1, 50, **TARGET)
    assert shares[PREFILL] == pytest.approx(head + target, rel=1e-12)
    assert seconds == pytest.approx(head + target, rel=1e-12)


@pytest.mark.parametrize("pad, kv", [(False, 100 + 300), (True, 2 * 300)])
def test_a_static_shape_engine_attends_every_row_over_the_longest_context(tiny_config, pad, kv):
    cost, config = unit_steps(tiny_config, scheduler={"pad_ragged": pad})
    seconds, _ = priced(plan_step(config, config.shape(0), held([100, 300]), 2), cost)
    assert seconds == pytest.approx(forward_s(2, 2, kv, **TARGET), rel=1e-12)


def proposing(lengths):
    return lambda rids, steps: np.array(lengths)


def test_rows_proposing_fewer_drafts_verify_their_own_proposal_on_a_flattening_engine(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3},
                              proposal_lengths=proposing([4, 2, 1]))
    slots = held()
    assert decode_tokens(config, config.full, slots, N) == 7
    plan = plan_step(config, config.full, slots, N)
    (verify,) = plan[-1].groups
    assert (verify.phase, verify.tokens, verify.query_max, verify.kv_tokens_sum) == (VERIFY, 7, 4, 103 + 201 + 300)
    seconds, shares = priced(plan, cost)
    # The drafts still run k = 3 forwards (the chain runs to the longest proposal).
    assert shares[DRAFT] == pytest.approx(chain_drafts_s(3, N, CTX_SUM), rel=1e-12)
    assert shares[VERIFY] == pytest.approx(forward_s(7, 7, 604, **TARGET), rel=1e-12)
    # A step cut at k = 1 verifies at most 2 tokens a row.
    assert list(row_verify_tokens(config, config.shape(1), slots, N)) == [2, 2, 1]


def test_rows_proposing_fewer_drafts_verify_the_longest_proposal_on_a_static_shape_engine(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3},
                              scheduler={"pad_ragged": True}, proposal_lengths=proposing([3, 2, 1]))
    # What the forward feeds, and so what a token budget counts: 3 rows of 3 tokens, not of k + 1.
    assert decode_tokens(config, config.full, held(), N) == 9
    _, shares = priced(plan_step(config, config.full, held(), N), cost)
    # Every row verifies the longest proposal's 3 tokens, over the longest context.
    assert shares[VERIFY] == pytest.approx(forward_s(9, 9, 3 * 300 + 3 * 2, **TARGET), rel=1e-12)


def test_a_replayed_step_at_which_nobody_drafted_is_a_plain_decode_step(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3}, engine=HOST,
                              proposal_lengths=proposing([1, 1, 1]), replayed_plain_steps=True)
    plan = plan_step(config, config.full, held(), N)
    assert plan.replayed_plain
    assert kinds(plan) == [StepHost, UniformForward] and plan[0] == StepHost(requests=N, verify_tokens=1)
    seconds, shares = priced(plan, cost)
    assert shares[DRAFT] == 0.0
    assert seconds == pytest.approx(host_s(N) + forward_s(N, N, CTX_SUM, **TARGET), rel=1e-12)
    # A step at which one row proposes is a speculative one.
    _, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3},
                           proposal_lengths=proposing([1, 3, 1]), replayed_plain_steps=True)
    assert not plan_step(config, config.full, held(), N).replayed_plain


def test_the_oracle_verifies_exactly_the_predrawn_tokens_of_each_row(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 4})
    predrawn = np.array([3, 1, 2])
    slots = held()
    assert decode_tokens(config, config.shape(2), slots, N, predrawn) == 6
    _, shares = priced(plan_step(config, config.shape(2), slots, N, predrawn=predrawn), cost)
    assert shares[DRAFT] == pytest.approx(chain_drafts_s(2, N, CTX_SUM), rel=1e-12)
    assert shares[VERIFY] == pytest.approx(forward_s(6, 6, CTX_SUM + 2 + 0 + 1, **TARGET), rel=1e-12)


def test_price_sums_a_subtotal_of_the_plan_like_its_items(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3}, engine=HOST)
    plan = plan_step(config, config.full, held(), N)
    subtotals = [item for item in plan if isinstance(item, Subtotal)]
    assert len(subtotals) == 1 and len(subtotals[0].items) == 2       # the first draft forward and the other two
    flat = [plan[0], *subtotals[0].items, *plan[2:]]
    assert price(plan, cost, [0.0] * len(PHASES)) == pytest.approx(price(flat, cost, [0.0] * len(PHASES)), rel=1e-12)


def test_goodput_prices_each_candidate_k_as_the_step_drafting_k(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3}, engine=HOST)
    seconds = price_decode_steps(config, cost, held(), N, [0, 1, 2, 3], np.array([1.0, 1.5, 2.0, 2.5]))
    expected = [host_s(N) + forward_s(N, N, CTX_SUM, **TARGET)]
    expected += [host_s(N) + chain_drafts_s(k, N, CTX_SUM) + speculation_host_s(N, k)
                 + forward_s(N * (k + 1), N * (k + 1), CTX_SUM + N * k, **TARGET) for k in (1, 2, 3)]
    assert seconds == pytest.approx(expected, rel=1e-12)


def test_goodput_charges_a_drafter_with_its_own_kv_the_catch_up_on_what_a_step_at_k_commits(tiny_config):
    cost, config = unit_steps(tiny_config, {"method": "eagle", "num_speculative_tokens": 3})
    seconds = price_decode_steps(config, cost, held(), N, [0, 1, 2, 3], np.array([1.0, 1.6, 2.2, 2.8]))
    # A step at k commits 4.8, 6.6 and 8.4 tokens over 3 rows: the next one catches up on 5, 7, 8.
    plain = forward_s(N, 0, CTX_SUM, **EAGLE) + forward_s(N, N, CTX_SUM, **TARGET)
    expected = [plain]
    for k, behind in ((1, 5), (2, 7), (3, 8)):
        rest = chain_drafts_s(k, N, CTX_SUM, EAGLE) - chain_drafts_s(1, N, CTX_SUM, EAGLE)
        expected.append(forward_s(behind, N, CTX_SUM, **EAGLE) + rest
                        + forward_s(N * (k + 1), N * (k + 1), CTX_SUM + N * k, **TARGET))
    assert seconds == pytest.approx(expected, rel=1e-12)


def test_goodput_prices_drafting_beside_a_prompt_chunk_by_what_it_adds_to_the_chunks_forward(tiny_config):
    """At 2 GFLOP/s the linears turn compute-bound between a few verification tokens and a 200-token
    chunk: drafting k beside the chunk costs what the k x 2 verification tokens add to the chunk's
    forward, more than they add to the decode rows' forward alone."""
    cost, config = unit_steps(tiny_config, {"method": "shadow", "num_speculative_tokens": 3},
                              hardware={**UNIT_HARDWARE, "bf16_tflops": 0.002})
    ctx = np.array([100, 300])
    ks, expected_tokens = [0, 1, 2, 3], np.ones(4)
    alone = price_decode_steps(config, cost, held(ctx), 2, ks, expected_tokens)
    beside = price_decode_steps(config, cost, held(ctx), 2, ks, expected_tokens, lambda k: [([7, 0, 500], 200)])
    chunk = prefill_group([200], [200], 0)

    def target(groups):
        return cost.forward(config.stacks.target, groups, [0.0] * len(PHASES))

    decode = uniform_group(DECODE, 2, 1, 400, kv_tokens=ctx)
    assert beside[0] == alone[0]
    for k in (1, 2, 3):
        verify = uniform_group(VERIFY, 2, k + 1, 400 + 2 * k, kv_tokens=ctx + k)
        added_beside = target([chunk, verify]) - target([chunk, decode])
        added_alone = target([verify]) - target([decode])
        assert beside[k] - alone[k] == pytest.approx(added_beside - added_alone, rel=1e-9)
        assert beside[k] - alone[k] > 1e-3 * alone[k]
