"""Stochastic verification keeps the target's distribution: a chi-square test on a tiny model."""
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from scipy import stats  # noqa: E402

from profiler.engine.model import Llama, LlamaConfig  # noqa: E402
from profiler.engine.sampling import probs_from_logits  # noqa: E402
from profiler.engine.drafters import NgramDrafter, SelfDrafter  # noqa: E402
from profiler.engine.eagle_drafter import EagleDrafter  # noqa: E402
from profiler.engine.eagle_head import EagleHead  # noqa: E402
from profiler.engine.serving import speculative_generate  # noqa: E402
from profiler.engine.speculative import Sampler  # noqa: E402
from profiler.engine.tree import TreeShape  # noqa: E402

VOCAB = 6
CONFIG = LlamaConfig(name="tiny", layers=2, hidden=16, heads=2, kv_heads=1, head_dim=8, ffn=32, vocab=VOCAB,
                     tied_embeddings=False, max_context=64)
PROMPT = [1, 4, 2]
SAMPLES = 30_000


def tiny_model():
    torch.manual_seed(3)
    model = Llama(CONFIG)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.6)
    return model.eval()


def eagle_drafter():
    """An EAGLE drafter with a random head (its drafts agree with the target some of the time)."""
    head = EagleHead(CONFIG)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.6)
    return EagleDrafter(head.eval())


@torch.inference_mode()
def target_joint(model, length: int, temperature: float, top_p: float) -> dict[tuple, float]:
    """Exact probability of every continuation of PROMPT of `length` tokens."""
    joint = {}
    for tail in itertools.product(range(VOCAB), repeat=length):
        tokens = torch.tensor([PROMPT + list(tail)])
        model.setup_cache(1, 16)
        probs = probs_from_logits(model(tokens, torch.arange(tokens.shape[1])[None]), temperature, top_p)[0]
        p = 1.0
        for i, token in enumerate(tail):
            p *= float(probs[len(PROMPT) - 1 + i, token])
        joint[tail] = p
    return joint


def chi_square_p(counts: dict[tuple, int], joint: dict[tuple, float], total: int) -> float:
    """Pearson chi-square p-value; cells expected below 5 are pooled into one."""
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for cell, p in joint.items():
        if p * total >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(p * total)
        else:
            pooled_o += counts.get(cell, 0)
            pooled_e += p * total
    if pooled_e == 0 and pooled_o:
        return 0.0                      # outcomes the target cannot produce (top-p cut) were seen
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    expected = np.array(expected) * sum(observed) / sum(expected)
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("drafter,top_p,tree", [
    (SelfDrafter(exit_layer=1), 1.0, None), (SelfDrafter(exit_layer=1), 0.8, None), (NgramDrafter(), 1.0, None),
    (SelfDrafter(exit_layer=1), 1.0, TreeShape(2, 2)), (SelfDrafter(exit_layer=1), 0.8, TreeShape(3, 1)),
    (NgramDrafter(), 1.0, TreeShape(2, 2)), (eagle_drafter(), 1.0, None)],
    ids=["layerskip", "layerskip-top-p", "ngram", "tree-2x2", "tree-3x1-top-p", "ngram-tree-2x2", "eagle"])
def test_rejection_sampling_reproduces_the_target_distribution(drafter, top_p, tree):
    # Chains: Leviathan's rejection sampling; trees: SpecInfer's recursive rejection over the
    # children (i.i.d. samples of the draft, or distinct deterministic n-gram candidates).
    model = tiny_model()
    sampler = Sampler(temperature=1.0, top_p=top_p, generator=torch.Generator().manual_seed(11))
    gen = speculative_generate(model, [PROMPT] * SAMPLES, 3, drafter, k=2, sampler=sampler, tree=tree)
    counts = {}
    for out in gen.outputs:
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    joint = target_joint(model, 3, 1.0, top_p)
    assert chi_square_p(counts, joint, SAMPLES) > 1e-3
    # The drafts were really rejected sometimes (so the residual path ran) and accepted sometimes.
    verify = [s for s in gen.steps if s.mode == "verify"]
    depth = tree.depth if tree is not None else 2
    assert 0 < sum(s.accepted for s in verify) < depth * len(verify)


def test_the_chi_square_test_tells_a_slightly_different_distribution_apart():
    # Power check: autoregressive sampling at temperature 1.15 instead of 1.0 must fail the test.
    model = tiny_model()
    sampler = Sampler(temperature=1.15, generator=torch.Generator().manual_seed(5))
    gen = speculative_generate(model, [PROMPT] * SAMPLES, 3, None, sampler=sampler)
    counts = {}
    for out in gen.outputs:
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    assert chi_square_p(counts, target_joint(model, 3, 1.0, 1.0), SAMPLES) < 1e-4
