"""spec_kernels.attention (Triton, through the CPU interpreter) against a float64 reference on random
shapes, random trees, partial-KV indices with padding and unsorted entries, and ragged lengths."""
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


def on_device(*tensors, **kwargs):
    """The arguments on the kernel device (the GPU, or the CPU for the interpreter)."""
    return [t.to(DEVICE) for t in tensors], {k: v.to(DEVICE) for k, v in kwargs.items()}


def random_tree_mask(parents: list[int]) -> torch.Tensor:
    """[Q, Q] bool: node i sees j when j is i or an ancestor; parents[i] < i, -1 for the root's children."""
    Q = len(parents)
    mask = torch.eye(Q, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


@st.composite
def cases(draw):
    B, kv_heads, group = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    Q, D = draw(st.integers(1, 8)), draw(st.sampled_from([16, 32, 64]))
    S = draw(st.integers(Q + 1, 300))
    lens = [draw(st.integers(Q, S)) for _ in range(B)]
    tree = draw(st.booleans())
    parents = [[draw(st.integers(-1, i - 1)) for i in range(Q)] for _ in range(B)] if tree else None
    indexed = draw(st.booleans())
    return dict(B=B, kv_heads=kv_heads, group=group, Q=Q, D=D, S=S, lens=lens, parents=parents, indexed=indexed,
                seed=draw(st.integers(0, 2**31 - 1)))


def build(case, dtype):
    g = torch.Generator().manual_seed(case["seed"])
    B, Hkv, group, Q, D, S = (case[k] for k in ("B", "kv_heads", "group", "Q", "D", "S"))
    q = torch.randn(B, Hkv * group, Q, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    kv_lens = torch.tensor(case["lens"])
    kwargs = {}
    if case["parents"] is not None:
        kwargs["tree_mask"] = torch.stack([random_tree_mask(p) for p in case["parents"]])
    if case["indexed"]:
        # A random subset of each head's prefix, shuffled, padded with garbage past its length.
        N = max(1, max(l - Q for l in case["lens"]))
        index = torch.randint(0, S, (B, Hkv, N), generator=g, dtype=torch.int32)
        index_lens = torch.zeros(B, dtype=torch.int32)
        for b, length in enumerate(case["lens"]):
            prefix = length - Q
            count = int(torch.randint(0, prefix + 1, (1,), generator=g)) if prefix else 0
            for h in range(Hkv):
                index[b, h, :count] = torch.randperm(prefix, generator=g)[:count].to(torch.int32)
            index_lens[b] = count
        kwargs.update(kv_index=index, kv_index_lens=index_lens)
    return (q.to(dtype), k.to(dtype), v.to(dtype), kv_lens), kwargs, (q, k, v)


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_fp32_matches_the_float64_reference(case):
    (q, k, v, kv_lens), kwargs, (q64, k64, v64) = build(case, torch.float32)
    args, device_kwargs = on_device(q, k, v, kv_lens, **kwargs)
    out = spec_kernels.attention(*args, **device_kwargs).cpu()
    expected = reference.attention(q64, k64, v64, kv_lens, **kwargs)
    assert out.dtype == torch.float32 and not torch.isnan(out).any()
    error = (out.double() - expected).abs().max() / expected.abs().max()
    assert error <= 1e-5


# bf16 arithmetic is right only on a GPU: Triton's interpreter rounds it wrongly.
HALF = [pytest.param(torch.float16, 2e-3, id="fp16"),
        pytest.param(torch.bfloat16, 1.6e-2, id="bf16",
                     marks=pytest.mark.skipif(DEVICE != "cuda", reason="bf16 runs only on a GPU"))]


@pytest.mark.parametrize("dtype,tolerance", HALF)
@settings(max_examples=15, deadline=None)
@given(case=cases())
def test_16_bit_matches_the_float64_reference(dtype, tolerance, case):
    (q, k, v, kv_lens), kwargs, _ = build(case, dtype)
    args, device_kwargs = on_device(q, k, v, kv_lens, **kwargs)
    out = spec_kernels.attention(*args, **device_kwargs).cpu()
    expected = reference.attention(q.double(), k.double(), v.double(), kv_lens, **kwargs)
    assert out.dtype == dtype
    assert (out.double() - expected).abs().max() / expected.abs().max() <= tolerance


def test_long_contexts_split_the_keys_and_combine_exactly():
    from spec_kernels.attention_triton import attention as triton_attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 32, generator=g)
    k, v = torch.randn(1, 2, 1200, 32, generator=g), torch.randn(1, 2, 1200, 32, generator=g)
    kv_lens = torch.tensor([1100])
    args, _ = on_device(q, k, v, kv_lens)
    one = triton_attention(*args, splits=1).cpu()
    many = triton_attention(*args, splits=5).cpu()
    expected = reference.attention(q.double(), k.double(), v.double(), kv_lens)
    for out in (one, many):
        assert (out.double() - expected).abs().max() / expected.abs().max() <= 1e-5


def test_long_verifies_tile_their_rows_and_match_the_reference():
    # Llama-8B's group of 4 query heads verifying 40 tree tokens: 160 rows, three tiles of 64 (one
    # tile would need more shared memory than a GPU has); causal and tree masks, indexed keys too.
    parents = [-1] + [max(-1, i - 1 - (i % 3)) for i in range(1, 40)]
    for tree in (False, True):
        for indexed in (False, True):
            case = dict(B=2, kv_heads=2, group=4, Q=40, D=32, S=180, lens=[170, 90], seed=7,
                        parents=[parents, parents] if tree else None, indexed=indexed)
            (q, k, v, kv_lens), kwargs, (q64, k64, v64) = build(case, torch.float32)
            args, device_kwargs = on_device(q, k, v, kv_lens, **kwargs)
            out = spec_kernels.attention(*args, **device_kwargs).cpu()
            expected = reference.attention(q64, k64, v64, kv_lens, **kwargs)
            assert not torch.isnan(out).any()
            assert (out.double() - expected).abs().max() / expected.abs().max() <= 1e-5


def test_more_splits_than_keys_leave_empty_splits_out_of_the_combine():
    # The split count follows the cache's length, not the requests': a 4,096-slot cache holding 45 and
    # 70 tokens gets 16 splits of a few keys, most of them empty, over two row tiles (group 4 x 20).
    from spec_kernels.attention_triton import attention as triton_attention

    case = dict(B=2, kv_heads=1, group=4, Q=20, D=16, S=4096, lens=[45, 70], seed=3, parents=None, indexed=False)
    (q, k, v, kv_lens), _, (q64, k64, v64) = build(case, torch.float32)
    args, _ = on_device(q, k, v, kv_lens)
    expected = reference.attention(q64, k64, v64, kv_lens)
    for splits in (None, 16):
        out = triton_attention(*args, splits=splits).cpu()
        assert not torch.isnan(out).any()
        assert (out.double() - expected).abs().max() / expected.abs().max() <= 1e-5


def test_the_reference_is_plain_softmax_attention_for_one_decode_token():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 1, 16, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float64), torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float64)
    kv_lens = torch.tensor([40, 25])
    out = reference.attention(q, k, v, kv_lens)
    for b, length in enumerate((40, 25)):
        for head in range(6):
            keys, values = k[b, head // 2, :length], v[b, head // 2, :length]
            weights = torch.softmax(keys @ q[b, head, 0] / 4.0, dim=0)
            torch.testing.assert_close(out[b, head, 0], weights @ values)
