"""EAGLE in the live engine (issue 28): the head drafting with its own KV cache proposes, at every
step, exactly the chain the evaluation computes from the whole output; the output is the target's
own (greedy, static and continuous serving with chunked prefill and row swaps); a head that knows
the target has every draft accepted; sampled verification keeps the target's distribution
(tests/profiler/test_sampling.py)."""
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from profiler.engine.eagle_drafter import EagleDrafter
from profiler.eagle.evaluate import chain_drafts
from profiler.engine.eagle_head import EagleHead
from profiler.engine.generate import generate
from profiler.engine.loaders import random_model
from profiler.engine.model import LlamaConfig
from profiler.engine.serving import ServeSpec, serve, speculative_generate
from profiler.engine.tree import TreeShape
from sim.policy import SpeculationPolicy

TINY = LlamaConfig(name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, vocab=50,
                   max_context=256, tied_embeddings=False)
PROMPTS = [[3, 17, 8, 22, 5], [9, 1, 40, 2, 2, 13, 30, 7, 11], [4, 4, 19], [25, 6, 33, 12, 48, 21, 0]]


def random_head(config: LlamaConfig, seed: int = 0, dtype=torch.float64, layout="standardized") -> EagleHead:
    head = EagleHead(config, layout)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        head.feature_std.uniform_(0.5, 2.0, generator=generator)
    return head.to(dtype).eval()


def recording(drafter: EagleDrafter) -> list:
    """Wrap the drafter's propose: every step's (history, proposed nodes) per row."""
    seen, propose = [], drafter.propose

    def spy(step, sampler=None):
        nodes, probs = propose(step, sampler)
        seen.extend(zip([list(h) for h in step.history], nodes.tolist()))
        return nodes, probs
    drafter.propose = spy
    return seen


def check_drafts_equal_the_evaluation(target, head, prompts, outputs, seen, k):
    proposed = []
    for prompt, output in zip(prompts, outputs):
        sequence = torch.tensor(prompt + output)
        target.setup_cache(1, len(sequence) + 1)
        with torch.no_grad():
            hidden = target.last_hidden(sequence[None], torch.arange(len(sequence))[None])[0]
        proposed.append(chain_drafts(head, target, sequence, hidden, len(prompt), k))
    for history, nodes in seen:
        request = next(i for i, (p, o) in enumerate(zip(prompts, outputs)) if history == (p + o)[:len(history)])
        chain = proposed[request][len(history) - 1 - len(prompts[request])].tolist()
        assert nodes == chain[:len(nodes)], (request, len(history))      # a policy's shorter chains: a prefix


class EveryThirdStepPlain(SpeculationPolicy):
    """k = 2, 3, then a step that drafts nothing (the head still reads that step's states)."""
    calls = 0

    def choose_k(self, running, decoding, price_s=None, state=None):
        self.calls += 1
        return (0, 2, 3)[self.calls % 3]


@pytest.mark.parametrize("serving,layout", [("static", "standardized"), ("continuous", "standardized"),
                                            ("policy", "standardized"), ("continuous", "eagle1")])
def test_live_drafts_are_the_evaluations_chain_and_the_output_is_the_targets(serving, layout):
    target = random_model(TINY, dtype=torch.float64, seed=1).model
    head = random_head(TINY, layout=layout)
    drafter = EagleDrafter(head)
    seen = recording(drafter)
    if serving == "static":
        outputs = speculative_generate(target, PROMPTS, 12, drafter, k=3).outputs
    elif serving == "policy":
        outputs = speculative_generate(target, PROMPTS, 12, drafter, k=3, policy=EveryThirdStepPlain(3)).outputs
    else:   # two rows for four requests, prompts prefilled 4 tokens at a time: rows swap and join
        outputs = serve(target, PROMPTS, 12, drafter, ServeSpec(max_batch=2, prefill_chunk=4, concurrency=2), k=3).outputs
    assert seen and outputs == [generate(target, [p], 12)[0] for p in PROMPTS]
    check_drafts_equal_the_evaluation(target, head, PROMPTS, outputs, seen, 3)


def knowing_target_and_head(config: LlamaConfig):
    """A one-layer target whose attention adds nothing (a bigram model) and a head that is that
    layer on the next token's embedding: the head's estimate is the target's state exactly."""
    target = random_model(config, dtype=torch.float64, seed=2).model
    H = config.hidden
    with torch.no_grad():
        target.layers[0].attention.wo.weight.zero_()
        head = EagleHead(config).to(torch.float64)
        head.layer.load_state_dict(target.layers[0].state_dict())
        head.fc.weight.zero_()
        head.fc.weight[:, :H] = torch.eye(H)
        head.fc.bias.zero_()
    return target, head.eval()


@pytest.mark.parametrize("tree", [None, TreeShape(2, 3)], ids=["chain", "tree-2x3"])
def test_a_head_that_knows_the_target_has_every_draft_accepted(tree):
    config = LlamaConfig(**{**TINY.__dict__, "layers": 1})
    target, head = knowing_target_and_head(config)
    gen = speculative_generate(target, PROMPTS, 13, EagleDrafter(head), k=3, tree=tree)
    assert gen.outputs == [generate(target, [p], 13)[0] for p in PROMPTS]
    # 13 tokens: the prefill's, then three steps of 3 accepted drafts + 1.
    assert [s.accepted for s in gen.steps] == [3] * 3 * len(PROMPTS)


def test_eagle_without_a_head_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "profiler", "live", "--method", "eagle", "--out", tmp_path / "run"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: --head: --method eagle drafts with a head: give --head DIR (python -m profiler train-eagle)")
