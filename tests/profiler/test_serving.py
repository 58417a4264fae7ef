"""Continuous batching on SmolLM2-135M (profiler.engine.serving): requests arrive, wait for a row,
prefill in chunks beside the running decodes and leave the step they finish; every greedy output
equals the autoregressive one."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from profiler.engine.drafters import DraftModelDrafter, NgramDrafter, ShadowDrafter  # noqa: E402
from profiler.engine.partial import PartialSpec  # noqa: E402
from profiler.engine.serving import ServeSpec, poisson_arrivals, serve, speculative_generate  # noqa: E402
from profiler.engine.tree import TreeShape  # noqa: E402
from sim.policy import SpeculationPolicy  # noqa: E402
from conftest import small_draft, spec_bench_rows  # noqa: E402

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def setup(smollm2):
    model, tok = smollm2
    prompts = [p for p in (tok.encode_chat(row["turns"][0]) for row in spec_bench_rows()[::11]) if len(p) <= 160][:8]
    # An end-of-sequence token that ends some outputs early and others never: ragged outputs.
    eos = speculative_generate(model, prompts[:1], NEW_TOKENS, None).outputs[0][4]
    reference = speculative_generate(model, prompts, NEW_TOKENS, None, eos_id=eos).outputs
    assert len({len(o) for o in reference}) > 1
    return model, prompts, eos, reference


CASES = {
    "autoregressive": lambda m: dict(drafter=None),
    "ngram-chain": lambda m: dict(drafter=NgramDrafter(), k=3),
    "ngram-tree-2x2": lambda m: dict(drafter=NgramDrafter(), tree=TreeShape(2, 2)),
    "shadow-int8": lambda m: dict(drafter=ShadowDrafter(m, bits=8), k=3),
    "draft-model": lambda m: dict(drafter=DraftModelDrafter(small_draft(m, 10)), k=3),
    "specpv-rectify-ngram": lambda m: dict(drafter=NgramDrafter(), k=3,
                                           partial=PartialSpec(budget=16, sink=16, window=16, period=4, rectify=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_continuous_batching_reproduces_autoregressive_output(setup, case):
    model, prompts, eos, reference = setup
    # 3 rows for 5 clients: requests wait; 48-token chunks: most prompts prefill over several
    # iterations while other requests decode.
    spec = ServeSpec(max_batch=3, prefill_chunk=48, concurrency=5)
    kwargs = CASES[case](model)
    served = serve(model, prompts, NEW_TOKENS, kwargs.pop("drafter"), spec, eos_id=eos, **kwargs)
    assert served.outputs == reference
    assert sum(s.committed for s in served.steps) == sum(len(o) - 1 for o in served.outputs)
    assert max(sum(1 for s in served.steps if s.step == step) for step in {s.step for s in served.steps}) <= 3
    if "specpv" in case:
        assert {"partial", "full"} <= {s.mode for s in served.steps}


def test_requests_wait_for_a_row_and_prefill_in_chunks_beside_decoding(setup):
    model, prompts, eos, reference = setup
    spec = ServeSpec(max_batch=2, prefill_chunk=32, concurrency=4)
    served = serve(model, prompts[:6], NEW_TOKENS, NgramDrafter(), spec, k=3, eos_id=eos)
    assert served.outputs == reference[:6]
    B = 6
    for r in range(B):
        assert served.arrival_s[r] <= served.admitted_s[r] < served.first_token_s[r] <= served.finish_s[r]
        chunks = [c for c in served.prefill_chunks if c[1] == r]
        assert sum(c[2] for c in chunks) == len(prompts[r])
        assert len(chunks) >= -(-len(prompts[r]) // 32) and len(chunks) == len({c[0] for c in chunks})
        ends = [s.end_s for s in served.steps if s.request == r]
        assert ends == sorted(ends) and (not ends or ends[0] > served.first_token_s[r] - 1e-9)
    # An iteration's 32-token budget is shared, oldest request first.
    per_iteration = {}
    for iteration, _, tokens, _ in served.prefill_chunks:
        per_iteration[iteration] = per_iteration.get(iteration, 0) + tokens
    assert max(per_iteration.values()) == 32
    # Clients 3 and 4 arrive at 0 and wait for a row; each later request arrives as one finishes.
    assert served.arrival_s[:4] == [0.0] * 4
    assert min(served.admitted_s[2:4]) >= min(served.finish_s[:2])
    assert sorted(served.arrival_s[4:]) == sorted(served.finish_s)[:2]
    # Some request decoded while another's prompt was still going in.
    assert any(served.admitted_s[r] < s.end_s < served.first_token_s[r]
               for r in range(B) for s in served.steps if s.request != r)


def test_open_loop_arrivals_and_the_kv_budget(setup):
    model, prompts, eos, reference = setup
    arrival_s = poisson_arrivals(4, rate_per_s=20.0, seed=3)
    assert arrival_s[0] == 0.0 and list(arrival_s) == sorted(arrival_s)
    served = serve(model, prompts[:4], NEW_TOKENS, None, ServeSpec(max_batch=4, arrival_s=arrival_s), eos_id=eos)
    assert served.outputs == reference[:4] and served.arrival_s == list(arrival_s)
    assert all(a <= t for a, t in zip(served.arrival_s, served.admitted_s))
    # A budget of one request's KV: one request at a time, in arrival order.
    budget = max(len(p) for p in prompts[:4]) + NEW_TOKENS
    one = serve(model, prompts[:4], NEW_TOKENS, None, ServeSpec(max_batch=4, kv_budget_tokens=budget, concurrency=4),
                eos_id=eos)
    assert one.outputs == reference[:4]
    assert all(one.admitted_s[r + 1] >= one.finish_s[r] for r in range(3))


def test_static_serving_is_what_a_batch_of_speculative_generate_runs(setup):
    model, prompts, eos, reference = setup
    spec = ServeSpec(max_batch=3, static=True, concurrency=3)
    served = serve(model, prompts[:6], NEW_TOKENS, NgramDrafter(), spec, k=3, eos_id=eos)
    assert served.outputs == reference[:6]
    # The second batch is admitted only once the first has left.
    assert min(served.admitted_s[3:]) >= max(served.finish_s[:3])
    assert len({served.first_token_s[r] for r in range(3)}) == 1


def test_bad_serve_specs_are_refused():
    with pytest.raises(ValueError, match="not both"):
        ServeSpec(max_batch=2, concurrency=2, arrival_s=(0.0, 1.0)).check(2)
    with pytest.raises(ValueError, match="sorted"):
        ServeSpec(max_batch=2, arrival_s=(1.0, 0.5)).check(2)
    with pytest.raises(ValueError, match="2 arrival times for 3"):
        ServeSpec(max_batch=2, arrival_s=(0.0, 0.5)).check(3)


class _Alternating(SpeculationPolicy):
    """A step policy switching between off, a short chain and the full one: every path a real
    policy can take, in one run."""

    def __init__(self):
        super().__init__(3)
        self.calls = 0
        self.seen = []

    def choose_k(self, running, decoding, price_s=None, state=None):
        self.calls += 1
        return (0, 1, 3)[self.calls % 3]

    def observe(self, records):
        self.seen += records


@pytest.mark.parametrize("drafter", ["ngram", "draft-model"])
def test_a_policy_changing_k_every_step_keeps_the_output_lossless(setup, drafter):
    model, prompts, eos, reference = setup
    # The draft model is a whole copy of the target: with its KV in step it accepts every draft.
    made = NgramDrafter() if drafter == "ngram" else DraftModelDrafter(small_draft(model, 30))
    policy = _Alternating()
    served = serve(model, prompts, NEW_TOKENS, made, ServeSpec(max_batch=3, prefill_chunk=48, concurrency=5),
                   k=3, eos_id=eos, policy=policy)
    assert served.outputs == reference
    drafted = {s.drafted for s in served.steps}
    assert drafted == {0, 1, 3}
    assert {s.mode for s in served.steps if s.drafted == 0} == {"decode"}
    assert policy.seen == served.steps
    if drafter == "draft-model":
        # It reads the steps that draft nothing, so the steps after them accept all their drafts
        # (up to the requests' ends); a draft that skipped them would miss a token of its KV.
        full = [s for s in served.steps if s.drafted and s.committed == s.drafted + 1]
        assert all(s.accepted == s.drafted for s in served.steps if s.drafted and s.committed > s.accepted)
        assert len(full) > len(served.steps) / 3
        blind = DraftModelDrafter(small_draft(model, 30))
        blind.follow = lambda model, alive: None
        skipped = serve(model, prompts, NEW_TOKENS, blind, ServeSpec(max_batch=3, prefill_chunk=48, concurrency=5),
                        k=3, eos_id=eos, policy=_Alternating())
        assert skipped.outputs == reference
        assert sum(s.accepted for s in skipped.steps) < sum(s.accepted for s in served.steps)


def test_off_above_batch_and_goodput_policies_on_the_engine(setup):
    from pathlib import Path

    from sim.policy import LearnedGoodput, OffAboveBatch
    from sim.step_price import DecodeStepPricer

    model, prompts, eos, reference = setup
    spec = ServeSpec(max_batch=3, prefill_chunk=48, concurrency=5)
    off = serve(model, prompts, NEW_TOKENS, NgramDrafter(), spec, k=3, eos_id=eos, policy=OffAboveBatch(3, 1))
    assert off.outputs == reference
    # More than one request runs until the last one drains: only the tail drafts.
    modes = [s.mode for s in off.steps]
    assert "decode" in modes and "verify" in modes
    assert all(s.drafted in (0, 3) for s in off.steps)

    bundle = Path(__file__).resolve().parents[2] / "calibration/cpu/smollm2-135m-chat-full"
    scenario = {"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32", "calibration": str(bundle),
                "speculation": {"method": "ngram", "num_speculative_tokens": 3, "acceptance": {"rate": 0.5},
                                "policy": "goodput"},
                "scheduler": {"pad_ragged": True, "prefill_forward": "per_request", "max_batch": 3}}
    goodput = LearnedGoodput(3)
    with pytest.raises(ValueError, match="step_pricer"):
        serve(model, prompts, NEW_TOKENS, NgramDrafter(), spec, k=3, eos_id=eos, policy=goodput)
    served = serve(model, prompts, NEW_TOKENS, NgramDrafter(), spec, k=3, eos_id=eos, policy=goodput,
                   step_pricer=DecodeStepPricer(scenario, 3, 400))
    assert served.outputs == reference
    # The estimate moved from its prior toward what the steps showed.
    assert not (goodput.survival() == LearnedGoodput(3).survival()).all()
    assert all(0 <= s.drafted <= 3 for s in served.steps)
