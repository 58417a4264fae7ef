"""The live engine's graph path (profiler/engine/graphs.py) on the CPU: the same static buffers,
capture sizes and padding rows a CUDA graph replays, run without the graph through Triton's CPU
interpreter; its tokens must be the eager kernel path's, and a warm-up sized like the run must
leave the run nothing to capture. (torch.cuda.graph itself needs a GPU: scripts/gpu-check.sh.)"""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import spec_kernels  # noqa: E402
from conftest import KERNEL_DEVICE, small_kernel_model as small_model  # noqa: E402
from profiler.engine import drafters, graphs, serving  # noqa: E402
from profiler.engine.model import KernelLayout  # noqa: E402
from profiler.engine.tree import TreeShape  # noqa: E402

if KERNEL_DEVICE == "cpu" and not spec_kernels.INTERPRET:
    pytest.skip("on the CPU the Triton code runs only with TRITON_INTERPRET=1", allow_module_level=True)

# Five ragged prompts: rows finish at different steps, so the batch shrinks through sizes (3) that
# replay a larger capture size (4) with padding rows.
PROMPTS = [[(7 * i + 3 * j) % 97 for j in range(length)] for i, length in enumerate((40, 55, 31, 47, 60))]


def test_capture_sizes_are_vllms_up_to_the_cache_rows():
    assert graphs.capture_sizes(1) == [1]
    assert graphs.capture_sizes(5) == [1, 2, 4, 5]
    assert graphs.capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graphs.capture_sizes(300)[-4:] == [256, 272, 288, 300]


@pytest.mark.parametrize("make", [
    lambda: dict(drafter=None),
    lambda: dict(drafter=drafters.NgramDrafter(), k=3),
    lambda: dict(drafter=drafters.NgramDrafter(), tree=TreeShape(2, 2)),
    lambda: dict(drafter=drafters.DraftModelDrafter(small_model(seed=1, layers=1)), k=3),
], ids=["decode", "chain", "tree", "draft-model-chain"])
def test_padded_static_buffers_give_the_eager_kernel_paths_tokens(make):
    # Six cache rows for five requests: the five replay capture size 6 with a padding row, and
    # speculative rows that finish early leave fewer (4 replays 4, 3 replays 4 with padding).
    spec = serving.ServeSpec(max_batch=6, static=True, concurrency=len(PROMPTS))
    model = small_model()
    eager = serving.serve(model, PROMPTS, 10, spec=spec, use_kernels=True, use_graphs=False, **make())
    assert model.step_graphs is None
    graphed = serving.serve(model, PROMPTS, 10, spec=spec, use_kernels=True, use_graphs=True, **make())
    assert graphed.cuda_graphs == (KERNEL_DEVICE == "cuda") and not eager.cuda_graphs   # the CPU: no graph
    assert graphed.outputs == eager.outputs
    assert [s.accepted for s in graphed.steps] == [s.accepted for s in eager.steps]
    assert {rows for rows, _ in model.step_graphs.captured} == {1, 2, 4, 6}
    graphs.disable_graphs(model)


def test_a_warm_up_sized_like_the_run_keeps_its_cache_and_buffers_for_the_run():
    model = small_model()
    needed = max(len(p) for p in PROMPTS) + 10 + 2 * 4 + 2
    warm = serving.speculative_generate(model, PROMPTS, 2, drafters.NgramDrafter(), k=3, use_kernels=True,
                                        use_graphs=True, cache_tokens=needed)
    cache = model.layers[0].attention.k_cache
    buffers = {key: entry.tokens for key, entry in model.step_graphs.captured.items()}
    run = serving.speculative_generate(model, PROMPTS, 10, drafters.NgramDrafter(), k=3, use_kernels=True,
                                       use_graphs=True, cache_tokens=needed)
    # What the run waited on, as meta.json records it: the warm-up captured, the run captured nothing
    # and met no kernel variant the warm-up had not.
    assert warm.graph_captures > 0 and run.graph_captures == 0 and run.kernel_variants == 0
    assert model.layers[0].attention.k_cache is cache
    assert all(model.step_graphs.captured[key].tokens is tokens for key, tokens in buffers.items())
    # A run needing a longer cache gets a new one, and the buffers bound to the old one are dropped.
    serving.speculative_generate(model, PROMPTS, 10, drafters.NgramDrafter(), k=3, use_kernels=True, use_graphs=True,
                         cache_tokens=needed + 64)
    assert model.layers[0].attention.k_cache is not cache
    assert all(model.step_graphs.captured[key].tokens is not tokens for key, tokens in buffers.items()
               if key in model.step_graphs.captured)
    graphs.disable_graphs(model)


def test_graphs_need_the_kernel_path():
    with pytest.raises(ValueError, match="use_kernels"):
        serving.speculative_generate(small_model(), PROMPTS[:1], 2, None, use_kernels=False, use_graphs=True)


def test_a_timer_sees_each_graphed_forward_once_and_no_module_hook_fires_inside_one():
    # The calibration's host-time fit times forwards by the model's hooks; a graphed step is timed by
    # the replay hooks instead (a module hook's synchronize inside a capture would end it).
    from profiler.calibrate.timing import timed_forwards

    model = small_model()
    graphs.enable_graphs(model)
    with timed_forwards(model) as seconds:
        run = serving.speculative_generate(model, PROMPTS[:2], 6, drafters.NgramDrafter(), k=2, use_kernels=True,
                                           use_graphs=True)
    steps = len({s.step for s in run.steps})
    assert len(seconds) == 1 + steps                   # the prompts' one forward, then one a step
    assert model.step_graphs.replay_hooks == []
    graphs.disable_graphs(model)


def test_exact_rows_captures_the_rows_asked_and_the_hidden_states_come_back():
    model = small_model()
    model.setup_cache(8, 64)
    graphs.enable_graphs(model, exact_rows=True)
    model.keep_hidden = True
    # Every input on the kernel's device: the eager reference below indexes the embedding with them.
    on = dict(device=KERNEL_DEVICE)
    tokens = torch.arange(15, **on).reshape(5, 3) % 97
    positions = torch.arange(3, **on).expand(5, 3) + 10
    kernel = KernelLayout(torch.full((5,), 13, dtype=torch.int32, **on),
                          graphs.chain_mask(3, KERNEL_DEVICE).expand(5, 3, 3))
    logits_at = torch.arange(3, **on).expand(5, 3)
    logits = graphs.forward_new_tokens(model, tokens, positions, positions, kernel, logits_at)
    assert set(model.step_graphs.captured) == {(5, 3)}
    hidden = model.kept_hidden
    graphs.disable_graphs(model)
    with torch.inference_mode():
        eager = model(tokens, positions, slots=positions, kernel=kernel, logits_at=logits_at)
    torch.testing.assert_close(logits, eager)
    torch.testing.assert_close(hidden, model.kept_hidden)


def test_a_policys_shapes_are_captured_after_serve_made_the_cache_under_inference_mode():
    # The live run's warm-up captures every k a policy may choose outside `serve`, whose KV cache is
    # an inference tensor: a capture writes it (as the CPU's runs the layers once), so it must run
    # under inference mode whoever calls it.
    model = small_model()
    serving.speculative_generate(model, PROMPTS[:2], 2, drafters.NgramDrafter(), k=2, use_kernels=True,
                                 use_graphs=True)
    assert not torch.is_inference_mode_enabled()
    captures = model.step_graphs.captures
    model.step_graphs.prepare(5)
    assert {(rows, T) for rows, T in model.step_graphs.captured if T == 5} == {(1, 5), (2, 5)}
    assert model.step_graphs.captures == captures + 2
    graphs.disable_graphs(model)


def test_a_copied_models_graphs_run_the_copy_not_the_original():
    import copy

    model = small_model()
    serving.speculative_generate(model, PROMPTS[:2], 2, None, use_kernels=True, use_graphs=True)
    twin = copy.deepcopy(model)
    assert twin.step_graphs.model is twin and twin.step_graphs.captured == {}
    assert model.step_graphs.model is model and model.step_graphs.captured
    graphs.disable_graphs(model)
    graphs.disable_graphs(twin)


def test_a_discarded_model_is_freed_at_once_though_its_graphs_point_back_at_it():
    import gc
    import weakref

    model = small_model()
    serving.speculative_generate(model, PROMPTS[:2], 2, None, use_kernels=True, use_graphs=True)
    gone = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert gone() is None           # no reference cycle held it for the cyclic collector
    finally:
        gc.enable()
