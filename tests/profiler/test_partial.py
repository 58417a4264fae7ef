"""SpecPV's block selection and partial attention against brute force."""
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from profiler.engine.model import attend_small_query  # noqa: E402
from spec_kernels.reference import block_summaries  # noqa: E402
from profiler.engine.partial import PartialSpec, PartialStep, attend_partial, select_kv_index  # noqa: E402


def random_case(seed, B=2, kv_heads=3, group=3, T=4, D=16, S=400):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, kv_heads * group, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, kv_heads, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, kv_heads, S, D, generator=g, dtype=torch.float64)
    return q, k, v


def brute_force_blocks(q, k, spec, refresh, window_start):
    """Per row and KV head: the budget/block eligible blocks with the highest Quest bound, the bound
    computed channel by channel as max(q_d * kmax_d, q_d * kmin_d)."""
    B, H, T, D = q.shape
    kv_heads = k.shape[1]
    group = H // kv_heads
    chosen = {}
    for b in range(B):
        n_blocks = int(refresh[b]) // spec.block
        for h in range(kv_heads):
            queries = q[b, h * group:(h + 1) * group].reshape(-1, D)
            scores = {}
            for i in range(n_blocks):
                if i * spec.block < spec.sink or (i + 1) * spec.block > int(window_start[b]):
                    continue
                keys = k[b, h, i * spec.block:(i + 1) * spec.block]
                kmax, kmin = keys.max(0).values, keys.min(0).values
                scores[i] = float(torch.maximum(queries * kmax, queries * kmin).sum(-1).mean())
            chosen[b, h] = set(sorted(scores, key=scores.get, reverse=True)[:spec.budget_blocks])
    return chosen


@pytest.mark.parametrize("seed", range(4))
def test_selection_is_sink_plus_quest_top_blocks_plus_recent(seed):
    spec = PartialSpec(budget=64, sink=32, window=48, block=16)
    q, k, _ = random_case(seed)
    refresh = torch.tensor([300, 250])
    window_start = refresh - spec.window
    end = refresh + torch.tensor([20, 7])
    step = PartialStep(spec, torch.arange(2), window_start, end, torch.ones(2, q.shape[2], dtype=torch.bool))
    k_max, k_min = block_summaries(k, refresh, spec.block)
    index, valid = select_kv_index(q, k_max, k_min, step)
    expected = brute_force_blocks(q, k, spec, refresh, window_start)
    for b in range(2):
        for h in range(3):
            slots = set(index[b, h][valid[b, h]].tolist())
            assert len(slots) == int(valid[b, h].sum())                 # no slot twice
            sink = set(range(spec.sink))
            recent = set(range(int(window_start[b]), int(end[b])))
            selected = slots - sink - recent
            assert sink <= slots and recent <= slots
            assert {s // spec.block for s in selected} == expected[b, h]
            assert len(selected) == spec.budget


def test_partial_attention_equals_dense_attention_restricted_to_the_selection():
    spec = PartialSpec(budget=48, sink=16, window=32, block=16)
    q, k, v = random_case(7)
    refresh = torch.tensor([330, 280])
    end = refresh + 4                                                  # the 4 query tokens sit at refresh..+3
    step = PartialStep(spec, torch.arange(2), refresh - spec.window, end, torch.ones(2, 4, dtype=torch.bool))
    k_max, k_min = block_summaries(k, refresh, spec.block)
    positions = refresh[:, None] + torch.arange(4)
    S = int(end.max())
    causal = (torch.arange(S)[None, None, :] <= positions[:, :, None])[:, None]        # [B, 1, T, S]
    out = attend_partial(q, k, v, causal, step, k_max, k_min, attend_small_query)
    index, valid = select_kv_index(q, k_max, k_min, step)
    allowed = torch.zeros(2, 3, S, dtype=torch.bool)
    for b in range(2):
        for h in range(3):
            allowed[b, h, index[b, h][valid[b, h]]] = True
    dense = attend_small_query(q, k[:, :, :S], v[:, :, :S], causal & allowed[:, :, None, :])
    torch.testing.assert_close(out, dense, rtol=1e-12, atol=1e-12)
    # Reading everything instead gives a different answer: the selection really drops keys.
    assert not torch.allclose(out, attend_small_query(q, k[:, :, :S], v[:, :, :S], causal))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), block=st.sampled_from([4, 16]))
def test_the_quest_score_bounds_every_key_of_its_block(seed, block):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 8 * block, 8, generator=g, dtype=torch.float64)
    k_max, k_min = block_summaries(k, torch.tensor([8 * block]), block)
    bound = torch.maximum(q[0, 0, 0] * k_max[0, 0], q[0, 0, 0] * k_min[0, 0]).sum(-1)            # [blocks]
    actual = (k[0, 0] @ q[0, 0, 0]).reshape(8, block).max(-1).values
    assert bool((bound >= actual - 1e-12).all())
