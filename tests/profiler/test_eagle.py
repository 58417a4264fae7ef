"""The EAGLE head (issue 28): its chain at every root computed at once equals running the head
over each root's own sequence; its file round-trips; bad heads are one line."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from profiler.eagle.data import Example
from profiler.eagle.evaluate import (acceptance_report, bigram_accepted, bigram_table, chain_accepted, chain_drafts,
                                      walk)
from profiler.engine.eagle_head import LAYOUTS, EagleHead, load_head, save_head, target_shape
from profiler.engine.loaders import random_model
from profiler.engine.model import LlamaConfig

TINY = LlamaConfig(name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, vocab=50,
                   max_context=256, tied_embeddings=False)


def tiny_head(seed=0, layout="standardized"):
    target = random_model(TINY, seed=seed).model
    head = EagleHead(TINY, layout)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
        head.feature_mean.normal_(0, 0.1)
        head.feature_std.uniform_(0.5, 2.0)
    return target, head.eval()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chain_at_every_root_equals_the_head_run_over_each_root_sequence(layout):
    target, head = tiny_head(layout=layout)
    L, k = 24, 4
    tokens = torch.randint(0, TINY.vocab, (L,), generator=torch.Generator().manual_seed(1))
    hidden = torch.randn(L, TINY.hidden, generator=torch.Generator().manual_seed(2)) * 3
    proposed = chain_drafts(head, target, tokens, hidden, 10, k)
    with torch.no_grad():
        for r, p in enumerate(range(10, L - 1)):
            # The head's inputs for root p: the target's states before p, then its own chain.
            states, nexts, drafts = list(head.features(hidden[:p], target)), list(tokens[1:p + 1]), []
            for _ in range(k):
                estimate = head.forward_sequence(torch.stack(states)[None], torch.stack(nexts)[None], target)[0, -1]
                drafts.append(int(head.logits(estimate, target).argmax()))
                states.append(estimate)
                nexts.append(torch.tensor(drafts[-1]))
            assert proposed[r].tolist() == drafts, f"root {p}"


def test_accepted_drafts_are_the_leading_matches_with_the_output():
    target, head = tiny_head()
    L, k = 20, 3
    tokens = torch.randint(0, TINY.vocab, (L,), generator=torch.Generator().manual_seed(3))
    hidden = torch.randn(L, TINY.hidden)
    proposed = chain_drafts(head, target, tokens, hidden, 5, k)
    # Make the output agree with the drafts at root 5 (first two), root 9 (all three), root 17 (to the end).
    tokens[6:8] = proposed[0, :2]
    tokens[8] = (proposed[0, 2] + 1) % TINY.vocab
    accepted = chain_accepted(head, target, tokens, hidden, 5, k)
    assert accepted[0] == 2 and accepted.max() <= k and len(accepted) == L - 1 - 5
    assert walk(np.array([2, 0, 0, 3, 1, 0, 0, 0]), 3).tolist() == [2, 3, 0]


def test_report_gives_per_position_rates_per_category():
    report = acceptance_report({"a": [np.array([0, 1, 4])], "b": [np.array([4, 4])]}, 4)
    assert report["a"]["per_position"][:2] == [2 / 3, 0.5] and report["a"]["tokens_per_step"] == pytest.approx(8 / 3)
    assert report["all"]["steps"] == 5 and report["all"]["accepted_per_step"] == pytest.approx(13 / 5)


def test_bigram_chain_drafts_the_commonest_successor_in_the_continuations():
    def example(tokens, prompt_tokens):
        t = torch.tensor(tokens)
        return Example(t, torch.zeros(len(tokens), 4), t, prompt_tokens, "c")

    # Prompt tokens [9, 9, 9, 5] count only as the first continuation token's root: 5 -> 1;
    # 1 -> 2 twice and 1 -> 3 once; 2 -> 3; 3 -> 1. From the second, 7 -> 8 and 7 -> 6 tie: 6.
    table = bigram_table([example([9, 9, 9, 5, 1, 2, 3, 1, 2, 3, 1, 3], 4), example([4, 7, 8, 7, 6], 1)])
    assert table == {5: 1, 1: 2, 2: 3, 3: 1, 4: 7, 7: 6, 8: 7}
    # Output 5 1 2 3 1 3 0: from token 5 the chain 1 2 3 1 matches all four; from 1, 2 3 1 and
    # then 2 against 3; from 2, two; from 3, one; from 1 and 3 at the end, none.
    accepted = bigram_accepted(table, torch.tensor([5, 1, 2, 3, 1, 3, 0]), 0, 4)
    assert accepted.tolist() == [4, 3, 2, 1, 0, 0]
    assert bigram_accepted(table, torch.tensor([5, 1, 2, 3, 1, 3, 0]), 0, 3)[0] == 3
    assert bigram_accepted(table, torch.tensor([6, 7, 6]), 0, 4).tolist() == [0, 1]   # 6 has no successor


def test_references_walk_a_training_sample_and_a_bigram_chain_like_the_held_out_figure():
    from profiler.eagle.train import evaluate_references, format_references

    target, head = tiny_head()
    g = torch.Generator().manual_seed(4)

    def example(L, prompt_tokens):
        t = torch.randint(0, TINY.vocab, (L,), generator=g)
        return Example(t, torch.randn(L, TINY.hidden, generator=g), t, prompt_tokens, "c")

    train, held = [example(30, 8), example(20, 5), example(26, 6)], [example(24, 4), example(18, 9)]
    references = evaluate_references(head, target, train, held, 3, seed=0)
    sample = references["head_on_training_sample"]
    assert sample["sequences"] == 2 and sample["steps"] >= 1
    table = bigram_table(train)
    steps = np.concatenate([walk(bigram_accepted(table, e.tokens, e.prompt_tokens, 3), 3) for e in held])
    assert references["bigram_on_held_out"]["steps"] == len(steps)
    assert references["bigram_on_held_out"]["accepted_per_step"] == pytest.approx(steps.mean())
    assert "bigram chain, held out" in format_references(references)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_head_file_round_trips_and_refuses_another_target(tmp_path, layout):
    target, head = tiny_head(layout=layout)
    save_head(head, tmp_path / "head", {"layout": layout, "target_shape": target_shape(TINY)})
    again, meta = load_head(tmp_path / "head", target)
    assert again.layout == layout
    tokens, hidden = torch.arange(12) % TINY.vocab, torch.randn(12, TINY.hidden)
    assert torch.equal(chain_drafts(head, target, tokens, hidden, 4, 3), chain_drafts(again, target, tokens, hidden, 4, 3))
    other = random_model(LlamaConfig(**{**TINY.__dict__, "hidden": 48, "head_dim": 12})).model
    with pytest.raises(Exception, match="was trained for a target of shape"):
        load_head(tmp_path / "head", other)


def test_train_eagle_without_prompts_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "profiler", "train-eagle", "--out", tmp_path / "h"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --prompts: give training prompts: --prompts FILE (JSONL) and/or --text FILE")


def test_the_loss_counts_only_the_continuation_unless_told_otherwise(tmp_path):
    """EAGLE's loss mask: the regression is over the estimates of f_p at positions p of the target's
    continuation (p >= prompt_tokens) only; --prompt-loss takes every position from 1."""
    import torch.nn.functional as F

    from profiler.eagle.data import Example
    from profiler.eagle.train import TrainEagleConfig, batch_loss

    target, head = tiny_head()
    L, prompt = 20, 12
    tokens = torch.randint(0, TINY.vocab, (L,), generator=torch.Generator().manual_seed(3))
    hidden = torch.randn(L, TINY.hidden, generator=torch.Generator().manual_seed(4))
    example = Example(tokens, hidden, torch.zeros(L, dtype=torch.long), prompt, "x")
    with torch.no_grad():
        estimates = head.forward_sequence(hidden[None, :-1], tokens[None, 1:], target)[0]   # of f_1 .. f_(L-1)
        errors = [F.smooth_l1_loss(head.standardize(estimates[i - 1]), head.standardize(hidden[i])) for i in range(1, L)]
        for prompt_loss, first in ((False, prompt), (True, 1)):
            config = TrainEagleConfig(out=tmp_path, noise=0.0, cls_weight=0.0, prompt_loss=prompt_loss)
            _, regression, _ = batch_loss(head, target, [example], config, torch.Generator().manual_seed(0))
            assert float(regression) == pytest.approx(float(torch.stack(errors[first - 1:]).mean()), rel=1e-5)


def test_an_eagle1_head_exports_under_eagle1_names_with_the_targets_rotary_layout():
    from profiler.engine.export_hf import eagle_state
    from profiler.engine.gguf_loader import permute_rope

    target, head = tiny_head(layout="eagle1")
    state = {name: value.numpy() for name, value in head.state_dict().items()}
    exported = eagle_state(state, TINY)
    layer = "layers.0."
    assert set(exported) == {"fc.weight", *(layer + n + ".weight" for n in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))}
    # Read back as the loaders read a Hugging Face checkpoint: Q and K permuted to the interleaved layout.
    wqkv = np.concatenate([permute_rope(exported[layer + "self_attn.q_proj.weight"], TINY.heads),
                           permute_rope(exported[layer + "self_attn.k_proj.weight"], TINY.kv_heads),
                           exported[layer + "self_attn.v_proj.weight"]])
    assert np.array_equal(wqkv, state["layer.attention.wqkv.weight"])
    assert np.array_equal(np.concatenate([exported[layer + "mlp.gate_proj.weight"], exported[layer + "mlp.up_proj.weight"]]),
                          state["layer.feed_forward.w_gate_up.weight"])
    assert "fc.bias" not in state and "layer.attention_norm.weight" not in state      # EAGLE-1 has neither


def test_exporting_a_standardized_head_for_vllm_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "profiler", "export-hf", "--head", "heads/smollm2-135m-eagle",
                           "--out", tmp_path / "h"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --head: heads/smollm2-135m-eagle is a standardized head; vLLM serves EAGLE-1's layout "
        "(python -m profiler train-eagle --layout eagle1)") and not (tmp_path / "h").exists()
