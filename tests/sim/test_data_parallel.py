"""Attention data parallel (sim/ranks.py): each rank attends over its own requests' KV, the slowest
rank sets the step, the MoE layers see every rank's tokens, and the KV each GPU holds is its own
rank's; with one rank the layout is tensor parallelism as before."""
import numpy as np
import pytest

from sim.cost.batch import PHASES
from sim.cost.memory import plan_memory
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.cost.work import ExpertsWork, RankedStep, StepHost, UniformForward
from sim.scenario.load import load_scenario
from sim.simulate import simulate
from sim.slots import DecodeSlots
from sim.step import plan_step, price, step_config

RANKS = 16
# DeepSeek-V3 (MLA, 256 routed experts) decoding on 16 H200s, priced by the roofline so that the
# figures do not depend on which tables are installed.
POOL = {"hardware": "h200", "model": "deepseek-v3", "dtype": "fp8", "engine": "sglang", "cost": "roofline",
        "tensor_parallel": 1, "data_parallel": RANKS, "expert_parallel": True,
        "workload": {"concurrency": 2 * RANKS, "requests": 4 * RANKS, "prompt_tokens": 1024, "output_tokens": 64}}


def decode_step(scenario, contexts):
    """The planned plain decode step over requests 0..n-1 holding `contexts`, and its price."""
    s = load_scenario(scenario)
    stacks = build_stacks(s)
    cost = cost_model_for(s)
    config = step_config(s, stacks, plan_memory(s, stacks, 2048, len(contexts)), cost, speculative=False)
    slots = DecodeSlots(len(contexts))
    for rid, ctx in enumerate(contexts):
        slots.add(rid, ctx, ctx + 100, rid)
    plan = plan_step(config, config.shape(0), slots, len(contexts))
    return plan, price(plan, cost, [0.0] * len(PHASES)), cost, stacks


def test_each_rank_attends_over_its_own_two_requests():
    contexts = [600 + 10 * rid for rid in range(2 * RANKS)]
    plan, seconds, cost, stacks = decode_step(POOL, contexts)
    (step,) = plan
    assert isinstance(step, RankedStep) and len(step.ranks) == RANKS
    for rank, work in enumerate(step.ranks):
        (forward,) = [item for item in work if isinstance(item, UniformForward)]
        mine = [ctx for rid, ctx in enumerate(contexts) if rid % RANKS == rank]
        assert forward.requests == 2 and forward.kv_tokens_sum == sum(mine)
    # The MoE layers run once over all 32 tokens, the exchange at the busiest rank's 2.
    (experts,) = step.experts
    assert isinstance(experts, ExpertsWork) and (experts.tokens, experts.rank_tokens) == (2 * RANKS, 2)
    # The step is the slowest rank's own work (the one with the longest contexts) plus the experts.
    pricer = cost.pricer(stacks.target)
    own = [price(work, cost, [0.0] * len(PHASES)) for work in step.ranks]
    assert seconds == pytest.approx(max(own) + sum(pricer.experts_s(2 * RANKS, 2)), rel=1e-12)
    assert max(own) == own[RANKS - 1]


def test_the_slowest_rank_sets_the_step_and_pays_only_its_own_kv():
    contexts = [600] * (2 * RANKS)
    contexts[0] = 4000                                   # rank 0 is the slowest
    _, base, cost, stacks = decode_step(POOL, contexts)
    c = cost.pricer(stacks.target).c
    longer = list(contexts)
    longer[RANKS + 5] += 800                             # rank 5's second request: still faster than rank 0
    assert decode_step(POOL, longer)[1] == pytest.approx(base, rel=1e-12)
    longer = list(contexts)
    longer[RANKS] += 800                                 # rank 0's second request
    # MLA's one-query attention is compute-bound on an H200 (each KV token is scored by all 128
    # heads): the request's own attention, 600 -> 1,400 KV tokens, in every layer.
    own = c.layers * (c.request_attention_s(1, 1400) - c.request_attention_s(1, 600))
    assert decode_step(POOL, longer)[1] - base == pytest.approx(own, rel=1e-6)


def test_tensor_parallel_reads_every_requests_kv_where_data_parallel_reads_its_own():
    contexts = [2000] * (2 * RANKS)
    tp = {**POOL, "tensor_parallel": RANKS, "data_parallel": 1}
    _, tp_s, tp_cost, stacks = decode_step(tp, contexts)
    c = tp_cost.pricer(stacks.target).c
    # MLA's latent is replicated on every tensor-parallel GPU: each reads all 32 requests' KV.
    plan, _, _, _ = decode_step(tp, contexts)
    (forward,) = [item for item in plan if isinstance(item, UniformForward)]
    assert forward.requests == 2 * RANKS and forward.kv_tokens_sum == sum(contexts)
    assert c.attn_bytes_per_kv == (512 + 64) * 2          # kv_rank + rope_dim, bf16 KV
    # One rank is what a tensor-parallel scenario always was: the field at 1 changes nothing.
    assert simulate({**tp}).run.throughput_tok_s == simulate({k: v for k, v in tp.items() if k != "data_parallel"}).run.throughput_tok_s


def test_each_gpu_holds_its_own_ranks_kv():
    dp, tp = load_scenario(POOL), load_scenario({**POOL, "tensor_parallel": RANKS, "data_parallel": 1})
    dp_memory = plan_memory(dp, build_stacks(dp), 2048, 64)
    tp_memory = plan_memory(tp, build_stacks(tp), 2048, 64)
    # The same per-GPU bytes a token (the latent, replicated under TP), but 16 ranks' pools.
    assert dp_memory.kv_bytes_per_token == tp_memory.kv_bytes_per_token
    assert dp_memory.kv_capacity_tokens > 10 * tp_memory.kv_capacity_tokens
    # Every GPU holds 1/16 of the routed experts under both; DP replicates the rest on each rank.
    assert dp_memory.layer_bytes > tp_memory.layer_bytes


def test_a_speculative_pool_runs_mtp_on_every_rank():
    scenario = {**POOL, "speculation": {"method": "mtp", "num_speculative_tokens": 1, "acceptance": {"rate": 0.8}}}
    result = simulate(scenario)
    assert result.run.tokens_per_step > 1.5
    assert "DP16 x TP1 attention, EP16" in result.scenario.layout
    share = result.run.time_share
    assert share["draft"] > 0 and share["verify"] > 0
    assert np.isfinite(result.speedup)


def test_expert_parallel_exchange_is_deepeps_measured_kernels_where_timed():
    import pandas as pd

    from sim.cost.operator_tables import data_root
    if data_root() is None:
        pytest.skip("aiconfigurator-core is not installed")
    eight = load_scenario({**POOL, "data_parallel": 8, "cost": "auto"})
    cost = cost_model_for(eight)
    exchange = cost.all_to_all
    assert exchange.origin.startswith("measured: aiconfigurator-core") and "DeepEP" in exchange.origin
    table = pd.read_parquet(data_root() / "h200_sxm/comm/vllm/0.24.0/moe_a2a_perf.parquet")
    shape = table[(table.hidden_size == 7168) & (table.topk == 8) & (table.num_experts == 256) & (table.ep_size == 8)]

    def measured_us(backend, tokens):
        rows = shape[(shape.comm_backend == backend) & (shape.num_tokens == tokens)]
        return float((rows.transmit_us + rows.notify_us).sum())

    values = 8 * 7168                                   # a token's top-k hidden states
    # Decode-sized messages take the low-latency kernels, a prompt's the high-throughput ones.
    assert exchange.exchange_s(16 * values, 8, 2) * 1e6 == pytest.approx(measured_us("deepep_ll", 16), rel=1e-9)
    assert exchange.exchange_s(4096 * values, 8, 2) * 1e6 == pytest.approx(measured_us("deepep_ht", 4096), rel=1e-9)
    # 16 GPUs: no table timed them, so the guess prices it and the result says so.
    assert "guess" in cost_model_for(load_scenario({**POOL, "cost": "auto"})).all_to_all.origin


def test_two_batch_overlap_pays_only_the_exchange_the_compute_does_not_hide():
    contexts = [1500] * (2 * RANKS)
    plain, plain_s, cost, stacks = decode_step(POOL, contexts)
    overlapped = {**POOL, "engine": {"preset": "sglang", "two_batch_overlap": True}}
    plan, overlapped_s, _, _ = decode_step(overlapped, contexts)
    (step,) = plan
    assert step.overlap and not plain[0].overlap
    # Each rank runs its 2 requests as two micro-batches of 1, each over the weights; the host once.
    for work in step.ranks:
        forwards = [item for item in work if isinstance(item, UniformForward)]
        assert [f.requests for f in forwards] == [1, 1]
        assert sum(isinstance(item, StepHost) for item in work) == 1
    (experts,) = step.experts
    assert (experts.tokens, experts.rank_tokens, experts.repeat) == (RANKS, 1, 2)
    compute = max(price(work, cost, [0.0] * len(PHASES)) for work in step.ranks)
    routed, exchange = experts.terms_s()
    compute += routed
    assert overlapped_s == pytest.approx(max(compute, exchange), rel=1e-12)
    # Without overlap the same micro-batches would pay the exchange on top.
    assert overlapped_s < compute + exchange


def test_collectives_past_the_nvlink_domain_cross_the_network():
    from sim.cost.collectives import InterconnectGuess

    hgx = InterconnectGuess(450e9, domain=8, network_bytes_s=50e9)
    nvl72 = InterconnectGuess(900e9, domain=72, network_bytes_s=100e9)
    message = 16 * 8 * 7168 * 2.0                       # 16 tokens' top-8 hidden states in bf16
    # Within one HGX board all traffic rides NVLink; on two boards half of it crosses InfiniBand.
    assert hgx.exchange_s(message / 2, 16, 2) > 2 * hgx.exchange_s(message / 2, 8, 2)
    assert hgx.exchange_s(message / 2, 16, 2) == pytest.approx(2 * (8e-6 + 8 / 16 * message / 50e9), rel=1e-12)
    # 64 GPUs are one NVL72 domain: no network.
    assert nvl72.exchange_s(message / 2, 64, 2) == pytest.approx(2 * (8e-6 + 63 / 64 * message / 900e9), rel=1e-12)
    # A hierarchical all-reduce: 1/8 of the message a GPU crosses between the two boards.
    assert hgx.all_reduce_s(1e6, 16) == pytest.approx(16e-6 + 2 * 7 / 8 * 1e6 / 450e9 + 2 * 1 / 2 * 1e6 / 8 / 50e9)
