"""The composed cost model (roofline and black-box pricers) on cases priced by hand."""
import pytest

from conftest import UNIT_ENGINE, UNIT_HARDWARE
from sim.cost.batch import DECODE, PARTIAL, PHASES, PREFILL, TRANSFER, VERIFY, FULL, Group, prompt_group, uniform_group
from sim.cost.model import calibrated_cost_model, cost_model_for
from sim.cost.collectives import ALLREDUCE_LATENCY_S
from sim.cost.stack import build_stacks
from sim.scenario.load import load_scenario


def unit_scenario(tiny_config, **fields):
    return load_scenario({"hardware": UNIT_HARDWARE, "engine": UNIT_ENGINE, "model": str(tiny_config),
                          "workload": {"concurrency": 1, "requests": 1, "prompt_tokens": 8,
                                       "output_tokens": 8}, **fields})


def shares():
    return [0.0] * len(PHASES)


def test_decode_of_one_token_is_every_byte_over_bandwidth(tiny_config):
    # Tiny model: hidden 4, 2 query heads and 1 KV head of dim 2, FFN 8, vocab 10, bf16.
    scenario = unit_scenario(tiny_config)
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    # Linears (in x out): qkv 4x8, o 4x4, gate_up 4x16, down 8x4. At one token each is memory-bound:
    # weights in*out*2 bytes plus activations (in+out)*2 bytes.
    linears = (32 * 2 + 12 * 2) + (16 * 2 + 8 * 2) + (64 * 2 + 20 * 2) + (32 * 2 + 12 * 2)
    # Elementwise: 2 bytes x (10 x 4 hidden + 2 x (2 + 1) heads x 2 dim + 3 x 8 ffn).
    elementwise = 2 * (10 * 4 + 2 * 3 * 2 + 3 * 8)
    # Attention of 1 query over 100 KV tokens: K and V of 1 head x dim 2 (8 bytes per token),
    # plus q read and out written (2 heads x 2 dims x 2 bytes x 2) = 16 bytes.
    attention = 100 * 8 + 16
    # Tied LM head 4 x 10 at one token: 40 * 2 weights + 14 * 2 activations.
    lm_head = 40 * 2 + 14 * 2
    expected_s = (linears + elementwise + attention + lm_head) / 1e9
    s = shares()
    got = cost.forward(target, [uniform_group(DECODE, 1, 1, 100)], s)
    assert got == pytest.approx(expected_s, rel=1e-12)
    assert s[DECODE] == pytest.approx(expected_s, rel=1e-12)


def test_prefill_prices_each_operator_on_its_own_roofline(tiny_config):
    scenario = unit_scenario(tiny_config)
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    T = 100_000
    roof = lambda flops, bytes_: max(flops / 1e12, bytes_ / 1e9)
    # Linears at T tokens: 2 T in out FLOPs against weights + T (in + out) activations, 2 bytes each.
    linears = sum(roof(2 * T * i * o, 2 * i * o + 2 * T * (i + o)) for i, o in ((4, 8), (4, 4), (4, 16), (8, 4)))
    elementwise = T * 2 * (10 * 4 + 2 * 3 * 2 + 3 * 8) / 1e9
    # Causal attention of T new tokens: 16 FLOPs per (q, kv) pair over T (T - (T-1)/2) pairs against
    # T tokens of K+V (8 bytes) and q/out (8 bytes): compute-bound at this length. Its rows (2 query
    # heads a KV head: 200,000) fill 1,563 tiles of 128, so 100,032 query tokens' worth is computed.
    padded = 1563 * 128 / 2
    attention = roof(16 * padded * (T - (T - 1) / 2), T * 8 + T * 8)
    lm_head = roof(2 * 40, 40 * 2 + 14 * 2)         # logits of the last token only
    s = shares()
    got = cost.forward(target, [prompt_group(T)], s)
    assert attention == 16 * padded * (T - (T - 1) / 2) / 1e12   # the case is compute-bound
    assert got == pytest.approx(linears + elementwise + attention + lm_head, rel=1e-12)
    assert s[PREFILL] == pytest.approx(got, rel=1e-12)


def test_tensor_parallel_halves_weights_and_adds_two_allreduces_per_layer(tiny_config):
    one = unit_scenario(tiny_config)
    two = unit_scenario(tiny_config, tensor_parallel=2)
    t1 = cost_model_for(one).forward(build_stacks(one).target, [uniform_group(DECODE, 1, 1, 0)], shares())
    stacks2 = build_stacks(two)
    cost2 = cost_model_for(two)
    t2 = cost2.forward(stacks2.target, [uniform_group(DECODE, 1, 1, 0)], shares())
    # Ring all-reduce of 4 hidden x 2 bytes over 1 GB/s: latency + 2 (tp-1)/tp x 8 bytes / 1e9.
    allreduce_s = ALLREDUCE_LATENCY_S + 8 / 1e9
    assert t2 > 2 * allreduce_s
    assert t2 - 2 * allreduce_s < t1


def test_partial_verification_reads_only_its_budget(tiny_config):
    scenario = unit_scenario(tiny_config)
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    full = cost.forward(target, [uniform_group(VERIFY, 4, 4, 4 * 50_000)], shares())
    partial = cost.forward(target, [uniform_group(PARTIAL, 4, 4, 4 * 2_000)], shares())
    # The difference is exactly the KV bytes not read: 8 bytes per token per request.
    assert full - partial == pytest.approx(4 * 48_000 * 8 / 1e9, rel=1e-9)


def test_offloaded_weights_stream_once_per_forward_and_overlap_with_compute(tiny_config):
    layer_bytes = 2 * (32 + 16 + 64 + 32)   # 288 bytes
    group = [uniform_group(DECODE, 1, 1, 10)]
    no_overlap = unit_scenario(tiny_config, offload={"weights": 1.0, "overlap": False})
    stack = build_stacks(no_overlap).target
    base = cost_model_for(no_overlap).forward(stack, group, shares())
    s = shares()
    streamed = cost_model_for(no_overlap).forward(stack, group, s, offloaded_layers=1)
    assert streamed - base == pytest.approx(layer_bytes / 0.5e9, rel=1e-9)
    assert s[TRANSFER] == pytest.approx(layer_bytes / 0.5e9, rel=1e-9)
    overlap = unit_scenario(tiny_config, offload={"weights": 1.0, "overlap": True})
    overlapped = cost_model_for(overlap).forward(stack, group, shares(), offloaded_layers=1)
    assert overlapped == pytest.approx(max(base, layer_bytes / 0.5e9), rel=1e-9)


def test_selection_reads_summaries_and_gathers_the_budget(tiny_config):
    scenario = unit_scenario(tiny_config)
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    s = shares()
    seconds = cost.selection(target, requests=1, context_sum=1600, query_tokens_sum=4, budget_tokens=320,
                             block_tokens=16, shares=s)
    # 100 blocks x (k_max + k_min) x 8 bytes of KV per token (K side counted as the K+V token size)
    # plus K and V of 320 selected tokens read and written.
    expected_bytes = 2 * 100 * 8 + 2 * 320 * 8
    assert seconds == pytest.approx(expected_bytes / 1e9, rel=1e-9)


def test_full_verify_group_pays_for_refed_tokens(tiny_config):
    scenario = unit_scenario(tiny_config)
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    plain = cost.forward(target, [uniform_group(VERIFY, 1, 4, 1000)], shares())
    refeed_group = Group(phase=FULL, requests=1, tokens=24, query_max=24, kv_tokens_sum=1000, logits_tokens=24)
    refeed = cost.forward(target, [refeed_group], shares())
    assert refeed > plain


def black_box_cost(bundle: str, engine: str, dtype: str):
    """A one-request scenario priced by a committed black-box bundle: its cost model, the bundle, the target."""
    from conftest import REPO
    from sim.formats.bundle import load_bundle

    path = REPO / "calibration" / bundle
    scenario = load_scenario({"hardware": "cpu", "model": "smollm2-135m", "dtype": dtype, "engine": engine,
                              "calibration": str(path), "workload": {"concurrency": 1, "requests": 1,
                                                                     "prompt_tokens": 8, "output_tokens": 8}})
    bundle = load_bundle(path)
    return calibrated_cost_model(scenario, bundle), bundle, build_stacks(scenario).target


def test_a_black_box_step_of_several_groups_pays_the_step_fixed_cost_once():
    """vLLM's bundle times whole server steps: a step that prefills one request and decodes others
    is one forward, so it pays the cheapest measured step (the fixed cost) once, not twice."""
    cost, bundle, target = black_box_cost("cpu-vllm/smollm2-135m", "vllm", "fp32")
    forward, prefill = bundle.table("engine_forward"), bundle.table("engine_prefill")
    decode = uniform_group(DECODE, 4, 3, 4 * 544)
    prompt = prompt_group(256)
    alone_decode = cost.forward(target, [decode], shares())
    alone_prompt = cost.forward(target, [prompt], shares())
    assert alone_decode == pytest.approx(forward(4, 3, 544))
    assert alone_prompt == pytest.approx(prefill(1, 256))
    fixed = forward(1, 1, bundle.table("engine_forward").axes[2][0])
    parts = shares()
    both = cost.forward(target, [prompt, decode], parts)
    assert both == pytest.approx(alone_decode + alone_prompt - fixed)
    assert sum(parts) == pytest.approx(both)          # the shares split the step's time
    # The drafter's work is inside the measured steps: no separate n-gram time.
    assert cost.host.host_draft(4, shares(), 600.0) == 0.0


def test_a_black_box_of_quantized_weights_prices_the_target_from_its_steps():
    """llama.cpp's bundle times its server on the Q4_1 GGUF (dtype int4): the target is priced by
    the engine's measured steps, as an fp32 vLLM's is, never by the roofline model."""
    cost, bundle, target = black_box_cost("cpu-llama-cpp/smollm2-135m", "llama.cpp", "int4")
    decode = cost.forward_uniform(target, DECODE, 2, 1, 2 * 560, shares())
    verify = cost.forward(target, [uniform_group(VERIFY, 1, 3, 560)], shares())
    prompt = cost.forward(target, [prompt_group(1024)], shares())
    assert decode == pytest.approx(bundle.table("engine_forward")(2, 1, 560))
    assert verify == pytest.approx(bundle.table("engine_forward")(1, 3, 560))
    assert prompt == pytest.approx(bundle.table("engine_prefill")(1, 1024))
    assert cost.warnings == []


EAGLE_BUNDLE = "calibration/cpu-vllm/smollm2-135m-eagle1"


def test_a_black_box_eagle_head_is_priced_by_the_drafting_its_steps_add():
    """A vLLM bundle with the EAGLE head's drafting timed (`calibrate --head`): a chain of k drafts
    runs k head forwards a step, each a k-th of engine_draft at k + 1 verified tokens; the head's
    prefill is engine_draft_prefill. A tree is not what vLLM's CPU build ran: roofline, said so."""
    from conftest import REPO
    from sim.cost.batch import DRAFT
    from sim.formats.bundle import load_bundle

    path = REPO / EAGLE_BUNDLE
    base = {"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32", "engine": "vllm", "calibration": str(path),
            "workload": {"concurrency": 1, "requests": 1, "prompt_tokens": 8, "output_tokens": 8}}
    bundle = load_bundle(path)
    draft_table, prefill_table = bundle.table("engine_draft"), bundle.table("engine_draft_prefill")
    kv = float(draft_table.axes[2][-1])
    for k in (2, 4):
        scenario = load_scenario({**base, "speculation": {"method": "eagle", "num_speculative_tokens": k,
                                                          "acceptance": {"rate": 0.2}}})
        cost = calibrated_cost_model(scenario, bundle)
        head = build_stacks(scenario).draft
        parts = shares()
        seconds = cost.forward(head, [uniform_group(DRAFT, 4, 1, int(4 * kv))], parts)
        assert seconds == pytest.approx(draft_table(4, k + 1, kv) / k) and sum(parts) == pytest.approx(seconds)
        prompt = prompt_group(256, logits_tokens=0)
        assert cost.forward(head, [prompt], shares()) == pytest.approx(prefill_table(1, 256))
        assert not any("eagle" in w for w in cost.warnings)
    tree = load_scenario({**base, "speculation": {"method": "eagle", "tree": {"width": 2, "depth": 3},
                                                  "acceptance": {"rate": 0.2}}})
    cost = calibrated_cost_model(tree, bundle)
    cost.forward(build_stacks(tree).draft, [uniform_group(DRAFT, 4, 2, 4 * 600)], shares())
    assert any("stack eagle priced by the roofline model" in w for w in cost.warnings)


def test_a_black_box_eagle_head_drafting_fewer_than_k_is_priced_at_the_steps_k(tmp_path):
    """A policy drafting k = 2 of the scenario's K = 4 runs two head forwards whose drafting the
    bundle timed at 3 verified tokens: engine_draft(n, 3, kv) in all, not 2/4 of engine_draft(n, 5,
    kv), what a head priced at the scenario's K charged before the step's k reached the pricer.
    (The committed bundle's drafting is linear in k, where the two agree: here a step's drafting
    at 3 tokens is made to cost half as much again.)"""
    import shutil

    import pandas as pd

    from conftest import REPO
    from sim.cost.batch import DRAFT
    from sim.cost.memory import plan_memory
    from sim.formats.bundle import load_bundle
    from sim.slots import DecodeSlots
    from sim.step import plan_step, price, step_config

    path = tmp_path / "bundle"
    shutil.copytree(REPO / EAGLE_BUNDLE, path)
    profile = pd.read_parquet(path / "profile.parquet")
    profile.loc[(profile.op == "engine_draft") & (profile["query"] == 3), "seconds"] *= 1.5
    profile.to_parquet(path / "profile.parquet")
    bundle = load_bundle(path)
    draft_table = bundle.table("engine_draft")
    kv = 700
    scenario = load_scenario({"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32", "engine": "vllm",
                              "calibration": str(path),
                              "workload": {"concurrency": 4, "requests": 4, "prompt_tokens": 8, "output_tokens": 8},
                              "speculation": {"method": "eagle", "num_speculative_tokens": 4,
                                              "acceptance": {"rate": 0.2}}})
    cost = calibrated_cost_model(scenario, bundle)
    stacks = build_stacks(scenario)
    config = step_config(scenario, stacks, plan_memory(scenario, stacks, 1024, 4), cost, speculative=True)
    slots = DecodeSlots(4)
    slots.hold([kv] * 4)

    def drafting_s(k: int) -> float:
        parts = shares()
        price(plan_step(config, config.shape(k), slots, 4), cost, parts)
        return parts[DRAFT]

    # The first head forward reads the context; the rest read the drafts too (a mean of k / 2 more).
    assert drafting_s(2) == pytest.approx(draft_table(4, 3, kv) / 2 + draft_table(4, 3, kv + 1) / 2, rel=1e-12)
    assert drafting_s(4) == pytest.approx(draft_table(4, 5, kv) / 4 + 3 * draft_table(4, 5, kv + 2) / 4, rel=1e-12)
    assert drafting_s(2) > 1.4 * 2 / 4 * draft_table(4, 5, kv)      # what k = 2 was charged at K = 4
