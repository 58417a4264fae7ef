"""Which Triton kernel variants a launch needs (spec_kernels/variants.py): keyed by Triton's own
specialisation rules, and after `warm_up` no query length, split count or partial-index length of
the engine's meets a variant the warm-up did not launch (on a GPU: compiles nothing while timed)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import spec_kernels  # noqa: E402
from conftest import KERNEL_DEVICE  # noqa: E402
from spec_kernels.variants import argument_specialisation  # noqa: E402

if KERNEL_DEVICE == "cpu" and not spec_kernels.INTERPRET:
    pytest.skip("on the CPU the Triton code runs only with TRITON_INTERPRET=1", allow_module_level=True)


def test_each_arguments_key_is_tritons_own():
    native = getattr(pytest.importorskip("triton._C.libtriton"), "native_specialize_impl", None)
    if native is None:
        pytest.skip("this triton has no native_specialize_impl to compare with")
    from triton.backends.compiler import BaseBackend

    values = [0, 1, 2, 16, 17, 48, -5, 2 ** 31, 2 ** 40, 2 ** 63, True, False, 0.5, None,
              torch.zeros(8), torch.zeros(8)[1:], torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int8),
              torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.bool)]
    for value in values:
        for specialise in (True, False):
            expected = tuple(native(BaseBackend, value, False, specialise, True))
            assert argument_specialisation(value, specialise) == expected, (value, specialise)


def engine_query(B: int, T: int, q_heads: int, kv_heads: int, D: int):
    """q [B, Hq, T, D] as the engine's attention has it: heads of a fused projection, transposed."""
    fused = torch.randn(B, T, q_heads + kv_heads, D, device=KERNEL_DEVICE)
    return fused.transpose(1, 2)[:, :q_heads]


def test_after_the_warm_up_no_query_length_split_count_or_index_length_needs_a_new_variant():
    # A model shape no other test uses: the variants met so far in this process are not its.
    q_heads, kv_heads, D = 10, 2, 16
    spec_kernels.warm_up_attention(q_heads, kv_heads, D, torch.float32, KERNEL_DEVICE, max_query_tokens=31,
                                   indexed=True)
    met = spec_kernels.variants_met()
    for B, T, slots, index_len in [(1, 1, 300, None), (3, 4, 300, None), (2, 7, 520, 40), (1, 26, 300, None),
                                   (2, 31, 700, 57), (4, 13, 300, 113), (1, 5, 1040, None)]:
        cache = torch.randn(B, kv_heads, slots, D, device=KERNEL_DEVICE)
        kv_lens = torch.full((B,), slots - 3, dtype=torch.int32, device=KERNEL_DEVICE)
        tree = torch.ones(T, T, dtype=torch.bool, device=KERNEL_DEVICE).tril().expand(B, T, T)
        index = lens = None
        if index_len is not None:
            index = torch.arange(index_len, dtype=torch.int32, device=KERNEL_DEVICE).expand(B, kv_heads, index_len)
            index, lens = index.contiguous(), torch.full((B,), index_len, dtype=torch.int32, device=KERNEL_DEVICE)
        spec_kernels.attention(engine_query(B, T, q_heads, kv_heads, D), cache, cache, kv_lens, tree_mask=tree,
                               kv_index=index, kv_index_lens=lens)
    assert spec_kernels.variants_met() == met
    # Another head dim is another kernel: the count does move when a launch needs a new variant.
    cache = torch.randn(1, kv_heads, 64, 32, device=KERNEL_DEVICE)
    spec_kernels.attention(engine_query(1, 1, q_heads, kv_heads, 32), cache, cache,
                           torch.full((1,), 10, dtype=torch.int32, device=KERNEL_DEVICE))
    assert spec_kernels.variants_met() == met + 2          # its split kernel and its combine
