"""Trees, a separate draft model, SpecPV partial verification and batch compaction on SmolLM2-135M:
every lossless configuration reproduces autoregressive greedy output exactly."""
import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from profiler.engine.drafters import DraftModelDrafter, NgramDrafter, SelfDrafter, ShadowDrafter  # noqa: E402
from profiler.engine.partial import PartialSpec  # noqa: E402
from conftest import REPO, small_draft, spec_bench_rows  # noqa: E402
from profiler.engine.eagle_drafter import EagleDrafter  # noqa: E402
from profiler.engine.eagle_head import load_head  # noqa: E402
from profiler.engine.serving import speculative_generate  # noqa: E402
from profiler.engine.tree import TreeShape  # noqa: E402

NEW_TOKENS = 16
# Small enough that SpecPV engages at Spec-Bench prompt lengths (about 40-200 tokens).
SMALL_PV = dict(budget=16, sink=16, window=16, period=4)


@pytest.fixture(scope="module")
def setup(smollm2):
    model, tok = smollm2
    # 20 prompts from across Spec-Bench (every 11th question, up to 160 tokens: 9 categories;
    # the long summarization and RAG prompts would make this test minutes longer).
    prompts = [p for p in (tok.encode_chat(row["turns"][0]) for row in spec_bench_rows()[::11]) if len(p) <= 160][:20]
    assert len(prompts) == 20
    ar = speculative_generate(model, prompts, NEW_TOKENS, None, eos_id=tok.eos_id)
    return model, tok, prompts, ar


CASES = {
    "tree-streaming-2x3": lambda m: dict(drafter=SelfDrafter(sink=16, window=48), tree=TreeShape(2, 3)),
    "tree-ngram-3x2": lambda m: dict(drafter=NgramDrafter(), tree=TreeShape(3, 2)),
    "draft-model-chain": lambda m: dict(drafter=DraftModelDrafter(small_draft(m, 20)), k=3),
    "draft-model-tree-2x2": lambda m: dict(drafter=DraftModelDrafter(small_draft(m, 20)), tree=TreeShape(2, 2)),
    # The committed EAGLE head (python -m profiler train-eagle, docs/live.md).
    "eagle-chain": lambda m: dict(drafter=EagleDrafter(load_head(REPO / "heads" / "smollm2-135m-eagle", m)[0]), k=4),
    "eagle-tree-2x3": lambda m: dict(drafter=EagleDrafter(load_head(REPO / "heads" / "smollm2-135m-eagle", m)[0]),
                                     tree=TreeShape(2, 3)),
    "specpv-rectify-ngram": lambda m: dict(drafter=NgramDrafter(), k=3, partial=PartialSpec(**SMALL_PV, rectify=True)),
    "specpv-rectify-shadow-steps": lambda m: dict(drafter=ShadowDrafter(m, bits=8), k=3, partial=PartialSpec(
        budget=32, sink=16, window=16, period=2, period_unit="steps", rectify=True)),
}


@pytest.mark.parametrize("case", CASES)
def test_lossless_configurations_reproduce_autoregressive_output_on_20_prompts(setup, case):
    model, tok, prompts, ar = setup
    sd = speculative_generate(model, prompts, NEW_TOKENS, eos_id=tok.eos_id, **CASES[case](model))
    assert sd.outputs == ar.outputs
    assert sum(s.committed for s in sd.steps) == sum(len(o) - 1 for o in sd.outputs)
    if "specpv" in case:
        modes = {s.mode for s in sd.steps}
        assert {"partial", "full"} <= modes


def test_a_draft_model_equal_to_the_target_is_always_accepted(setup):
    # Its own KV cache, caught up each step: any error there would show as a rejection.
    model, tok, prompts, ar = setup
    for kwargs in (dict(k=4), dict(tree=TreeShape(2, 3))):
        sd = speculative_generate(model, prompts[:4], NEW_TOKENS, DraftModelDrafter(copy.deepcopy(model)),
                                  eos_id=tok.eos_id, **kwargs)
        assert sd.outputs == ar.outputs[:4]
        depth = kwargs.get("k") or kwargs["tree"].depth
        full = [s for s in sd.steps if s.committed == depth + 1]
        assert len(full) >= len(sd.steps) - 4       # only each request's last step may be cut short
        assert all(s.accepted == depth for s in sd.steps)


def test_specpv_runs_full_verification_every_period_and_refeeds_the_tokens_since_the_refresh(setup):
    model, tok, prompts, ar = setup
    spec = PartialSpec(budget=16, sink=16, window=16, period=5)
    sd = speculative_generate(model, prompts[:3], NEW_TOKENS, NgramDrafter(), k=2, eos_id=tok.eos_id, partial=spec)
    for request in range(3):
        steps = [s for s in sd.steps if s.request == request]
        assert steps[0].mode == "full" and steps[0].refed == 0        # the first selection
        since = 0                 # tokens committed since the refresh (a full step refreshes after it)
        for s in steps[1:]:
            assert s.mode == ("full" if since >= spec.period else "partial")
            if s.mode == "full":
                assert s.refed == since
                since = 0
                continue
            # sink + selected blocks + recent range (window, tokens since the refresh, root, drafts)
            assert s.kv_tokens <= spec.sink + spec.budget + spec.window + since + 1 + 2
            since += s.committed


def test_finished_requests_leave_the_batch_and_the_others_continue_unchanged(setup):
    model, tok, prompts, ar = setup
    # An end-of-sequence token that stops the first request early and the others later or never.
    eos = ar.outputs[0][4]
    reference = speculative_generate(model, prompts[:4], NEW_TOKENS, None, eos_id=eos).outputs
    assert len(reference[0]) == 5 and max(len(o) for o in reference) == NEW_TOKENS
    for drafter in (SelfDrafter(sink=16, window=48), ShadowDrafter(model, bits=8),
                    DraftModelDrafter(small_draft(model, 10))):
        sd = speculative_generate(model, prompts[:4], NEW_TOKENS, drafter, k=3, eos_id=eos)
        assert sd.outputs == reference
