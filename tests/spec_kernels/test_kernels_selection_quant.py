"""Block summaries, Quest selection and the int4/int8 matmul: Triton (CPU interpreter) against the
references, and the references against brute force."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import spec_kernels  # noqa: E402
from spec_kernels import reference  # noqa: E402

from conftest import KERNEL_DEVICE as DEVICE  # noqa: E402

if DEVICE == "cpu" and not spec_kernels.INTERPRET:
    pytest.skip("on the CPU the Triton code runs only with TRITON_INTERPRET=1", allow_module_level=True)


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 3), kv_heads=st.integers(1, 3), D=st.sampled_from([16, 32, 64]), block=st.sampled_from([16, 32]),
       seed=st.integers(0, 10_000), data=st.data())
def test_block_summaries_match_the_reference(B, kv_heads, D, block, seed, data):
    S = data.draw(st.integers(block, 300))
    lens = torch.tensor([data.draw(st.integers(1, S)) for _ in range(B)])
    k = torch.randn(B, kv_heads, S, D, generator=torch.Generator().manual_seed(seed))
    k_max, k_min = (t.cpu() for t in spec_kernels.block_summaries(k.to(DEVICE), lens.to(DEVICE), block))
    ref_max, ref_min = reference.block_summaries(k, lens, block)
    assert k_max.shape == (B, kv_heads, int(lens.max()) // block, D)
    torch.testing.assert_close(k_max, ref_max, rtol=0, atol=0)
    torch.testing.assert_close(k_min, ref_min, rtol=0, atol=0)


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 3), kv_heads=st.integers(1, 3), group=st.integers(1, 4), Q=st.integers(1, 8),
       D=st.sampled_from([16, 32, 64]), reduce=st.sampled_from(["mean", "max"]), seed=st.integers(0, 10_000))
def test_block_scores_match_the_reference(B, kv_heads, group, Q, D, reduce, seed):
    from spec_kernels.selection_triton import block_scores

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, kv_heads * group, Q, D, generator=g)
    k_max, k_min = torch.randn(B, kv_heads, 20, D, generator=g), torch.randn(B, kv_heads, 20, D, generator=g)
    expected = reference.block_scores(q.double(), k_max.double(), k_min.double(), reduce)
    scores = block_scores(q.to(DEVICE), k_max.to(DEVICE), k_min.to(DEVICE), reduce).cpu()
    assert (scores.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_selected_index_is_sink_plus_best_blocks_plus_window_and_feeds_attention():
    g = torch.Generator().manual_seed(3)
    B, kv_heads, group, Q, D, S, block = 2, 3, 2, 4, 32, 500, 16
    q = torch.randn(B, kv_heads * group, Q, D, generator=g)
    k, v = torch.randn(B, kv_heads, S, D, generator=g), torch.randn(B, kv_heads, S, D, generator=g)
    kv_lens = torch.tensor([480, 300])
    k_max, k_min = (t.cpu() for t in spec_kernels.block_summaries(k.to(DEVICE), (kv_lens - Q).to(DEVICE), block))
    index, lens = (t.cpu() for t in spec_kernels.select_blocks(q.to(DEVICE), k_max.to(DEVICE), k_min.to(DEVICE), 4,
                                                          sink_tokens=32, window_tokens=64,
                                                          kv_lens=kv_lens.to(DEVICE), block=block))
    scores = reference.block_scores(q, k_max, k_min)
    for b in range(B):
        prefix = int(kv_lens[b]) - Q
        for h in range(kv_heads):
            chosen = index[b, h, :lens[b]].tolist()
            assert chosen == sorted(set(chosen))                               # ascending, no repeats
            sink, window = set(range(32)), set(range(prefix - 64, prefix))
            blocks = {p // block for p in set(chosen) - sink - window}
            eligible = [i for i in range(k_max.shape[2]) if i * block >= 32 and (i + 1) * block <= prefix - 64]
            best = sorted(eligible, key=lambda i: float(scores[b, h, i]), reverse=True)[:4]
            assert sink | window <= set(chosen) and blocks == set(best)
            assert len(chosen) == 32 + 4 * block + 64
    out = spec_kernels.attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), kv_lens.to(DEVICE), kv_index=index.to(DEVICE),
                            kv_index_lens=lens.to(DEVICE)).cpu()
    expected = reference.attention(q.double(), k.double(), v.double(), kv_lens, kv_index=index, kv_index_lens=lens)
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_short_contexts_select_what_exists():
    q = torch.randn(1, 2, 1, 16)
    k = torch.randn(1, 1, 64, 16)
    kv_lens = torch.tensor([41])                       # prefix of 40: sink 32, window 64 cover it all
    k_max, k_min = spec_kernels.block_summaries(k, kv_lens - 1, 16)
    index, lens = spec_kernels.select_blocks(q, k_max, k_min, 8, sink_tokens=32, window_tokens=64, kv_lens=kv_lens)
    assert index[0, 0, :lens[0]].tolist() == list(range(40))


@settings(max_examples=12, deadline=None)
@given(bits=st.sampled_from([4, 8]), group=st.sampled_from([32, 64]), M=st.integers(1, 40),
       N=st.integers(1, 150), groups=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_quant_matmul_matches_the_reference(bits, group, M, N, groups, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, group * groups, generator=g)
    x = torch.randn(M, group * groups, generator=g)
    packed = spec_kernels.quantize(w, bits, group)
    y = spec_kernels.quant_matmul(x.to(DEVICE), {k: v.to(DEVICE) if torch.is_tensor(v) else v
                                            for k, v in packed.items()}).cpu()
    expected = reference.quant_matmul(x.double(), packed)
    assert y.shape == (M, N) and not torch.isnan(y).any()
    assert (y.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_quantization_error_is_within_half_a_step_and_int4_packs_two_per_byte():
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(0))
    for bits in (4, 8):
        packed = spec_kernels.quantize(w, bits, 64)
        assert packed["codes"].shape == (8, 128 // (8 // bits)) and packed["codes"].dtype == torch.uint8
        step = packed["scale"].repeat_interleave(64, dim=1)
        assert bool(((reference.dequantize(packed) - w).abs() <= step / 2 + 1e-6).all())
