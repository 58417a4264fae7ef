"""Properties that hold for any scenario: hypothesis draws the scenarios."""
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim.cost.batch import FULL, PARTIAL, PHASES, uniform_group
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.scenario.load import load_scenario

HARDWARE = st.sampled_from(["h100-sxm", "a100-80g", "l40", "rtx-4090"])
MODELS = st.sampled_from(["llama-3.1-8b", "qwen2.5-7b", "llama-3.2-1b", "qwen3-4b"])
METHODS = st.sampled_from([("eagle", {}), ("ngram", {}), ("shadow", {"bits": 4}), ("layerskip", {"exit_layer": 4}),
                           ("medusa", {}), ("draft_model", {"model": "DRAFT"})])
# A draft model of the target's own family (same tokenizer).
DRAFT_FOR = {"llama-3.1-8b": "llama-3.2-1b", "llama-3.2-1b": "llama-3.2-1b", "qwen2.5-7b": "qwen2.5-1.5b",
             "qwen3-4b": "qwen3-4b"}


def with_family_draft(draft: dict, model: str) -> dict:
    return {**draft, "model": DRAFT_FOR[model]} if draft.get("model") == "DRAFT" else draft
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(hardware=HARDWARE, model=MODELS, method=METHODS, batch=st.integers(1, 48), k=st.integers(1, 6),
       low=st.floats(1.0, 7.0), gap=st.floats(0.25, 3.0))
def test_speedup_falls_as_acceptance_falls(hardware, model, method, batch, k, low, gap):
    name, draft = method
    high = min(low + gap, k + 1.0)
    low = min(low, high - 0.25)
    if low < 1.0:
        return
    base = {"hardware": hardware, "model": model,
            "workload": {"concurrency": batch, "requests": batch, "prompt_tokens": 200, "output_tokens": 120}}

    def simulate(tokens_per_step):
        spec = {"method": name, "num_speculative_tokens": k, "draft": with_family_draft(draft, model),
                "acceptance": {"tokens_per_step": tokens_per_step}}
        return sim.simulate({**base, "speculation": spec})

    slow, fast = simulate(low), simulate(high)
    # More tokens per step never needs more steps; fewer steps is faster. Where both need the same
    # number of steps (the last step of each request commits only what is left), the lower
    # acceptance can be cheaper by a hair (a draft with its own KV catches up on fewer committed
    # tokens), which is physics, not a bug.
    assert fast.run.iterations <= slow.run.iterations
    if fast.run.iterations < slow.run.iterations:
        assert slow.speedup < fast.speedup
    else:
        assert slow.speedup <= fast.speedup * 1.001


@FAST
@given(model=MODELS, batch=st.integers(1, 64), context=st.integers(2_000, 120_000),
       budget_blocks=st.integers(4, 256), since=st.integers(0, 64), verify=st.integers(1, 64))
def test_partial_verification_reads_fewer_bytes_than_full(model, batch, context, budget_blocks, since, verify):
    budget = 16 * budget_blocks
    static = 32 + budget + 128
    if static + since >= context:
        return
    scenario = load_scenario({"hardware": "h100-sxm", "model": model})
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    shares = [0.0] * len(PHASES)
    partial = cost.forward(target, [uniform_group(PARTIAL, batch, verify, batch * (static + since + verify))], shares)
    full = cost.forward(target, [uniform_group(FULL, batch, verify, batch * (context + verify - 1))], shares)
    assert partial < full


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rate=st.floats(0.1, 0.95), spread=st.floats(0.0, 0.05),
       batch=st.integers(1, 16), method=METHODS)
def test_same_seed_same_result(seed, rate, spread, batch, method):
    name, draft = method
    scenario = {"hardware": "a100-80g", "model": "llama-3.1-8b", "seed": seed,
                "workload": {"concurrency": batch, "requests": 2 * batch,
                             "prompt_tokens": {"dist": "lognormal", "mean": 300, "std": 150},
                             "output_tokens": {"dist": "uniform", "mean": 100, "std": 30}},
                "speculation": {"method": name, "draft": with_family_draft(draft, "llama-3.1-8b"),
                                "acceptance": {"rate": rate, "request_spread": spread}}}
    assert sim.simulate(scenario).to_dict() == sim.simulate(scenario).to_dict()
