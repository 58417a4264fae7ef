"""Prefill and decode on separate pools (sim/pools.py): a request's TTFT is its prefill on a prefill
server plus its KV's transfer plus its wait for a decode slot; an unlimited prefill pool hands the
decode pool its requests prefilled on arrival; the servers share the prompts round robin."""
import pytest

from sim.cost.batch import PHASES
from sim.cost.memory import plan_memory
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.pools import prefill_scenario
from sim.prefill import prefill_chunks
from sim.scenario.load import load_scenario
from sim.simulate import simulate
from sim.slots import DecodeSlots
from sim.step import plan_step, price, step_config

PROMPT, OUTPUT = 3000, 64
BASE = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": "vllm", "cost": "roofline",
        "workload": {"concurrency": 1, "requests": 3, "prompt_tokens": PROMPT, "output_tokens": OUTPUT},
        "disaggregation": {"prefill": {"instances": 1, "tensor_parallel": 2, "prefill_chunk": 2048},
                           "transfer": {"link": "network", "latency_s": 2e-4}}}


def prefill_s(scenario) -> float:
    """What one prefill server takes for one prompt, chunk by chunk, priced as the pool prices it."""
    server = prefill_scenario(load_scenario(scenario))
    stacks = build_stacks(server)
    cost = cost_model_for(server)
    config = step_config(server, stacks, plan_memory(server, stacks, PROMPT + OUTPUT + 1, 1), cost, False)
    entry, total = [0, 0, PROMPT], 0.0
    while entry[1] < PROMPT:
        chunks = prefill_chunks([entry], 2048)
        total += price(plan_step(config, config.shape(0), DecodeSlots(1), 0, chunks), cost, [0.0] * len(PHASES))
        entry[1] += chunks[0][1]
    return total


def test_ttft_is_the_prefill_servers_prefill_and_the_kv_transfer():
    result = simulate(BASE)
    s = result.scenario
    # Llama-3.1-8B's K and V: 32 layers x 8 KV heads x 128 x 2 bytes x 2, split over the server's 2 GPUs,
    # each sending its half over its own 50 GB/s NIC.
    shard = 2 * 32 * 8 * 128 * 2 / 2
    transfer = 2e-4 + PROMPT * shard / (s.hardware_spec.network_gb_s * 1e9)
    # One request at a time: no queueing anywhere.
    assert result.baseline.ttft_ms["p50"] == pytest.approx((prefill_s(BASE) + transfer) * 1e3, rel=1e-9)
    assert result.baseline.time_share["prefill"] == 0          # the decode pool never prefills
    assert "prefill 1 x TP2, decode TP1" in s.layout and s.deployment_gpus == 3


def test_an_unlimited_prefill_pool_hands_over_every_request_on_arrival():
    result = simulate({**BASE, "disaggregation": {"prefill": "unlimited"}})
    assert result.baseline.ttft_ms["p99"] == 0.0
    assert result.scenario.deployment_gpus == 1
    one_pool = simulate({k: v for k, v in BASE.items() if k != "disaggregation"})
    assert result.baseline.e2e_ms["p50"] < one_pool.baseline.e2e_ms["p50"]


def test_a_faster_link_and_more_servers_shorten_the_wait():
    loaded = {**BASE, "workload": {**BASE["workload"], "concurrency": 8, "requests": 16}}
    network = simulate(loaded).baseline.ttft_ms["p90"]
    nvlink = {**loaded, "disaggregation": {**BASE["disaggregation"], "transfer": {"link": "nvlink"}}}
    assert simulate(nvlink).baseline.ttft_ms["p90"] < network
    two = {**loaded, "disaggregation": {**BASE["disaggregation"],
                                        "prefill": {**BASE["disaggregation"]["prefill"], "instances": 2}}}
    assert simulate(two).baseline.ttft_ms["p90"] < 0.8 * network


def test_speculation_runs_on_the_decode_pool_and_its_draft_prefills_on_the_prefill_pool():
    spec = {**BASE, "speculation": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": {"rate": 0.7}}}
    result = simulate(spec)
    assert result.run.tokens_per_step > 1.5 and result.speedup > 1.0
    # The EAGLE head's prompt KV is prefilled and sent too: a later first token than the baseline's.
    assert result.run.ttft_ms["p50"] > result.baseline.ttft_ms["p50"]
