"""The SimPy model agrees with the closed forms where both apply (single request, steady state)."""
import numpy as np
import pytest

import sim
from sim.acceptance import GeometricAcceptance
from sim.analytic import expected_tokens_per_step, leviathan_speedup, magicdec_speedup, steady_state

PROMPT, OUTPUT = 32, 2000


def single_request(method, **speculation):
    return {"hardware": "h100-sxm", "model": "llama-3.1-8b",
            "workload": {"concurrency": 1, "requests": 3, "prompt_tokens": PROMPT, "output_tokens": OUTPUT},
            "speculation": {"method": method, "num_speculative_tokens": 4,
                            "acceptance": {"tokens_per_step": 2.8}, **speculation}}


@pytest.mark.parametrize("method,draft", [
    ("eagle", {}), ("eagle3", {}), ("mtp", {}), ("medusa", {}), ("ngram", {}),
    ("shadow", {"bits": 4}), ("layerskip", {"exit_layer": 8}), ("draft_model", {"model": "llama-3.2-1b"}),
])
def test_simulated_decode_speedup_matches_the_closed_form_within_one_percent(method, draft):
    scenario = single_request(method, draft=draft)
    result = sim.simulate(scenario)
    # Costs are linear in context while memory-bound, so the mean context prices the mean step.
    closed = steady_state(scenario, PROMPT + OUTPUT // 2, 2.8)
    assert result.decode_speedup == pytest.approx(closed.speedup, rel=0.01)


def test_leviathan_form_is_the_magicdec_form_when_verification_costs_one_decode():
    a, k, c = 0.8, 5, 0.05
    tokens = expected_tokens_per_step(a, k)
    assert tokens == pytest.approx(sum(a ** i for i in range(k + 1)))
    assert leviathan_speedup(a, k, c) == pytest.approx(magicdec_speedup(tokens, k, c, 1.0))
    assert leviathan_speedup(a, k, c) == pytest.approx(tokens / 1.25)


def test_geometric_acceptance_reproduces_the_expected_tokens_per_step():
    model = GeometricAcceptance(0.7, 4, np.random.default_rng(0))
    tokens, total = model.draw(200_000, None, None, None)
    assert total == tokens.sum()
    assert tokens.min() == 1 and tokens.max() == 5
    assert tokens.mean() == pytest.approx(expected_tokens_per_step(0.7, 4), rel=0.01)


def test_constant_tokens_per_step_is_reproduced_by_the_simulation():
    result = sim.simulate(single_request("eagle"))
    assert result.run.tokens_per_step == pytest.approx(2.8, abs=0.005)
