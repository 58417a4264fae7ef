"""Greedy speculative decoding on SmolLM2-135M reproduces autoregressive greedy output exactly."""
import itertools
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from profiler.gguf_loader import load_gguf, smollm2_path  # noqa: E402
from profiler.speculative import NgramDrafter, SelfDrafter, speculative_generate  # noqa: E402
from profiler.tokenizer import tokenizer_from_gguf  # noqa: E402

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench_questions.jsonl"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def setup():
    if not QUESTIONS.exists():
        pytest.skip(f"{QUESTIONS} not present")
    loaded = load_gguf(smollm2_path())
    tok = tokenizer_from_gguf(gguf.GGUFReader(loaded.path))
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines()[:20]]
    prompts = [tok.encode_chat(row["turns"][0]) for row in rows]
    ar = speculative_generate(loaded.model, prompts, NEW_TOKENS, None, eos_id=tok.eos_id)
    return loaded.model, tok, prompts, ar


@pytest.mark.parametrize("drafter", [NgramDrafter(), SelfDrafter(exit_layer=12), SelfDrafter(sink=16, window=48)],
                         ids=["ngram", "layerskip", "streaming"])
def test_greedy_speculation_is_lossless_on_20_prompts(setup, drafter):
    model, tok, prompts, ar = setup
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
