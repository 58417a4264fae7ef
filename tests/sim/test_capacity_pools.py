"""`sim capacity --pools` (sim/capacity_pools.py): the fewest GPUs whose prefill servers and decode
ranks meet both SLOs at the scenario's own rate; every layout with fewer GPUs that was tried misses."""
import pytest

from sim.capacity_pools import format_pools, size_pools
from sim.errors import InputError

POOLS = {"hardware": "h100-sxm", "model": "qwen3-30b-a3b", "tensor_parallel": 1, "expert_parallel": True,
         "engine": "sglang", "cost": "roofline",
         "disaggregation": {"prefill": {"instances": 1, "tensor_parallel": 1, "prefill_chunk": 8192}},
         "workload": {"arrival": "poisson", "rate_qps": 20, "requests": 80, "prompt_tokens": 2000, "output_tokens": 128},
         "scheduler": {"max_batch": 512}, "slo": {"ttft_ms_p90": 1000, "tpot_ms_p90": 15}}


def test_the_fewest_gpus_meeting_both_slos():
    out = size_pools(POOLS, max_gpus=8)
    best = out["best"]
    assert best["slo_met"] and best["ttft_ms_p90"] <= 1000 and best["tpot_ms_p90"] <= 15
    assert all(not r["slo_met"] for r in out["rows"] if r["gpus"] < best["gpus"])
    # One decode GPU cannot hold the TPOT at this rate however many prefill servers feed it.
    assert any(r["decode_ranks"] == 1 and not r["slo_met"] for r in out["rows"])
    assert out["layout"].startswith(f"prefill {best['prefill_servers']} x TP1, decode DP{best['decode_ranks']}")
    text = format_pools(out)
    assert f"fewest GPUs: {best['gpus']}" in text and "--enable-dp-attention" in text


@pytest.mark.parametrize("change,message", [
    ({"disaggregation": {"prefill": "unlimited"}}, "disaggregation.prefill: --pools sizes a prefill pool"),
    ({"workload": {"arrival": "closed", "concurrency": 8}}, "workload.arrival: --pools sizes the pools"),
    ({"slo": {"ttft_ms_p90": 1000}}, "slo: --pools needs both"),
])
def test_what_it_cannot_size_is_one_line(change, message):
    with pytest.raises(InputError) as error:
        size_pools({**POOLS, **change})
    assert str(error.value).startswith(message)
