"""Greedy speculative decoding on SmolLM2-135M reproduces autoregressive greedy output exactly."""
import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from profiler.engine.shadow import QuantLinear  # noqa: E402
from profiler.engine.drafters import NgramDrafter, SelfDrafter, ShadowDrafter  # noqa: E402
from conftest import spec_bench_rows  # noqa: E402
from profiler.engine.serving import speculative_generate  # noqa: E402

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def setup(smollm2):
    model, tok = smollm2
    prompts = [tok.encode_chat(row["turns"][0]) for row in spec_bench_rows()[:20]]
    ar = speculative_generate(model, prompts, NEW_TOKENS, None, eos_id=tok.eos_id)
    return model, tok, prompts, ar


@pytest.mark.parametrize("make", [NgramDrafter, lambda: SelfDrafter(exit_layer=12),
                                  lambda: SelfDrafter(sink=16, window=48), "shadow"],
                         ids=["ngram", "layerskip", "streaming", "shadow-int4"])
def test_greedy_speculation_is_lossless_on_20_prompts(setup, make):
    model, tok, prompts, ar = setup
    drafter = ShadowDrafter(model, bits=4) if make == "shadow" else make()
    sd = speculative_generate(model, prompts, NEW_TOKENS, drafter, k=4, eos_id=tok.eos_id)
    assert sd.outputs == ar.outputs
    verify_steps = [s for s in sd.steps if s.mode == "verify"]
    assert verify_steps and all(s.drafted == 4 and 1 <= s.committed <= 5 for s in verify_steps)
    # Accepted = the longest prefix of matching drafts.
    assert all(s.accepted == len(list(itertools.takewhile(bool, s.accept_flags))) for s in verify_steps)
    # Every output token after the first (from prefill) was committed by a verification step.
    assert sum(s.committed for s in verify_steps) == sum(len(o) - 1 for o in sd.outputs)


def test_streaming_self_draft_accepts_most_tokens(setup):
    model, tok, prompts, ar = setup
    sd = speculative_generate(model, prompts[:4], NEW_TOKENS, SelfDrafter(sink=16, window=48), k=4,
                              eos_id=tok.eos_id)
    steps = [s for s in sd.steps if s.mode == "verify"]
    assert sum(s.committed for s in steps) / len(steps) > 2.0


def test_ngram_lookup_follows_the_latest_earlier_match():
    drafter = NgramDrafter(max_ngram=2)
    assert drafter.lookup([1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3], 3) == [4, 5, 2]
    assert drafter.lookup([7, 8, 9], 2) == [9, 9]            # no earlier n-gram: repeat the last
    assert drafter.lookup([5, 6, 5], 3) == [6, 5, 5]          # short continuation padded


def test_shadow_draft_shares_the_targets_embeddings_and_kv_and_accepts_more_at_8_bits(setup):
    model, tok, prompts, ar = setup
    rates = {}
    for bits in (8, 4):
        drafter = ShadowDrafter(model, bits=bits)
        assert drafter.shadow.embed is model.embed and drafter.shadow.lm_head is model.lm_head
        sd = speculative_generate(model, prompts[:6], NEW_TOKENS, drafter, k=4, eos_id=tok.eos_id)
        assert drafter.shadow.layers[0].attention.k_cache is model.layers[0].attention.k_cache
        assert isinstance(drafter.shadow.layers[0].attention.wqkv, QuantLinear)
        assert drafter.shadow.layers[0].attention_norm is model.layers[0].attention_norm
        steps = [s for s in sd.steps if s.mode == "verify"]
        rates[bits] = sum(s.committed for s in steps) / len(steps)
    assert rates[8] > rates[4] > 2.0
