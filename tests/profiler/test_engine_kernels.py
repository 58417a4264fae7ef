"""The live engine with its verification attention in spec_kernels.attention (the CUDA path), run
through Triton's CPU interpreter on a small random model: the same tokens as the torch path."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import spec_kernels  # noqa: E402
from conftest import KERNEL_DEVICE, small_kernel_model as small_model  # noqa: E402
from profiler.engine.drafters import NgramDrafter, SelfDrafter  # noqa: E402
from profiler.engine.partial import PartialSpec  # noqa: E402
from profiler.engine.serving import compile_kernels, speculative_generate  # noqa: E402
from profiler.engine.tree import TreeShape  # noqa: E402

if KERNEL_DEVICE == "cpu" and not spec_kernels.INTERPRET:
    pytest.skip("on the CPU the Triton code runs only with TRITON_INTERPRET=1", allow_module_level=True)


# Prompts of different lengths (ragged rows), long enough for SpecPV to engage.
PROMPTS = [[(7 * i + 3 * j) % 97 for j in range(length)] for i, length in enumerate((90, 120, 75))]


@pytest.mark.parametrize("kwargs", [
    dict(drafter=None),
    dict(drafter=NgramDrafter(), k=3),
    dict(drafter=SelfDrafter(exit_layer=1), tree=TreeShape(2, 2)),
    dict(drafter=NgramDrafter(), k=2, partial=PartialSpec(budget=16, sink=16, window=16, period=3)),
    dict(drafter=NgramDrafter(), k=2, partial=PartialSpec(budget=16, sink=16, window=16, period=3, rectify=True)),
], ids=["decode", "chain", "tree", "specpv", "specpv-rectify"])
def test_kernel_attention_path_gives_the_torch_paths_tokens(kwargs):
    model = small_model()
    torch_path = speculative_generate(model, PROMPTS, 12, use_kernels=False, **kwargs)
    kernel_path = speculative_generate(model, PROMPTS, 12, use_kernels=True, **kwargs)
    assert kernel_path.outputs == torch_path.outputs
    assert [s.accepted for s in kernel_path.steps] == [s.accepted for s in torch_path.steps]
    if "partial" in kwargs:
        assert {s.mode for s in kernel_path.steps} >= {"partial", "full"}


def test_the_shadow_draft_on_the_int4_kernel_drafts_what_its_dequantized_weights_draft():
    from profiler.engine.drafters import ShadowDrafter

    model = small_model()
    dense = speculative_generate(model, PROMPTS, 12, ShadowDrafter(model, bits=4, group_size=16, use_kernels=False),
                                 k=3, use_kernels=False)
    packed = ShadowDrafter(model, bits=4, group_size=16, use_kernels=True)
    assert packed.shadow.layers[0].attention.wqkv.dense is None          # only the packed codes are kept
    kernel = speculative_generate(model, PROMPTS, 12, packed, k=3, use_kernels=False)
    assert kernel.outputs == dense.outputs
    agree = sum(a.accepted == b.accepted for a, b in zip(kernel.steps, dense.steps))
    assert agree >= 0.9 * len(dense.steps)       # fp32 sums in another order may flip a rare near-tie


def test_after_compile_kernels_a_specpv_run_launches_no_variant_it_had_not_met():
    # SpecPV's full verifications re-feed the tokens accepted since the refresh (12 here, with 2
    # drafts and the root: 15 query tokens against the partial steps' 3), and a partial index's
    # length changes every step. Each model shape below is this test's own, so its variants are new
    # to the process.
    def specpv(heads):
        model = small_model(heads=heads)
        return model, dict(drafter=NgramDrafter(), k=2, partial=PartialSpec(budget=16, sink=16, window=16, period=12))

    model, kwargs = specpv(heads=6)
    cold = speculative_generate(model, PROMPTS, 24, use_kernels=True, **kwargs)
    assert cold.kernel_variants > 0
    model, kwargs = specpv(heads=8)
    compile_kernels(model, kwargs["drafter"], max_query_tokens=2 * 3 + 12 + 2 + 1 + 2, partial=True)
    warm = speculative_generate(model, PROMPTS, 24, use_kernels=True, **kwargs)
    assert {s.mode for s in warm.steps} >= {"partial", "full"}
    assert {s.query_tokens for s in warm.steps} >= {3, 15}
    assert warm.kernel_variants == 0
