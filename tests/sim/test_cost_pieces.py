"""The cost model's pieces for GPU deployments, each against a hand-computed case: the GEMM corner,
mixtures of experts, multi-head latent attention, FP8 and int4 weights, speculative host work,
static batches and decode-only accounting, config.json beyond Llama."""
import json
import math

import numpy as np
import pytest

from sim.cost.batch import DRAFT, OVERHEAD, PHASES
from sim.cost.memory import kv_bytes_per_token
from sim.cost.model import cost_model_for
from sim.cost.roofline import RooflineRates
from sim.cost.stack import build_stacks
from sim.scenario import load_scenario
from conftest import VLLM_BEFORE_57
from sim.scenario.presets import MODELS, load_hf_config
from sim.scenario.schema import INT4_WEIGHT_BYTES
from sim.simulate import simulate

PLAIN_H100 = {"preset": "h100-sxm", "gemm_corner": None}


def scenario(**fields):
    # The roofline's pieces (cost: roofline; the measured operator tables' are tests/sim/test_measured.py's).
    base = {"hardware": PLAIN_H100, "model": "llama-3.1-8b", "cost": "roofline",
            "workload": {"concurrency": 1, "requests": 1, "prompt_tokens": 16, "output_tokens": 8}}
    base.update(fields)
    return load_scenario(base)


def target_cost(s):
    cost = cost_model_for(s)
    return cost, cost.pricer(build_stacks(s).target).c


def test_gemm_corner_is_the_smooth_maximum():
    s = scenario(hardware={"preset": "h100-sxm", "gemm_corner": 2.0})
    _, c = target_cost(s)
    assert c.combine(3.0, 4.0) == pytest.approx(5.0)             # (3^2 + 4^2)^(1/2)
    assert c.combine(1.0, 1.0) == pytest.approx(math.sqrt(2))    # 2^(1/p) at the ridge
    assert c.combine(0.0, 7.0) == pytest.approx(7.0)
    plain = target_cost(scenario())[1]
    assert plain.combine(3.0, 4.0) == 4.0                         # no corner: the roofline's max


def test_distinct_experts_and_the_routed_cost():
    s = scenario(model="mixtral-8x7b")
    cost, c = target_cost(s)
    assert c.distinct_experts(1) == pytest.approx(2.0)
    assert c.distinct_experts(2) == pytest.approx(8 * (1 - 0.75 ** 2))      # 3.5
    assert c.distinct_experts(1000) == pytest.approx(8.0)
    # One routed layer at 2 tokens: 3.5 experts of 3 x 4096 x 14336 bf16 weights, memory-bound.
    expert_bytes = 3 * 4096 * 14336 * 2
    bytes_s = 3350e9 * 0.80
    act = 2 * 2 * (2 * 4096 + 3 * 14336) * 2          # tokens x top_k x (2h + 3f) x 2 bytes
    assert c.routed_time_s(2) == pytest.approx((3.5 * expert_bytes + act) / bytes_s)
    # Verifying 4 tokens reads more expert weights than decoding 1: the MoE penalty of speculation.
    assert c.routed_time_s(4) / c.routed_time_s(1) > 2.0


def test_latent_attention_kv_and_flops():
    model = MODELS["deepseek-v3"]
    assert kv_bytes_per_token(model, 8, 1) == 61 * (512 + 64)          # one latent per layer, not split by TP
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], 1, 2) == 2 * 32 * 8 * 128 * 2
    s = load_scenario({"hardware": {"preset": "h200", "gemm_corner": None}, "model": "deepseek-v3", "dtype": "fp8",
                       "kv_dtype": "fp8", "tensor_parallel": 8,
                       "workload": {"concurrency": 1, "requests": 1, "prompt_tokens": 16, "output_tokens": 4}})
    _, c = target_cost(s)
    heads = 128 / 8
    assert c.attn_flops_per_q_kv == 2 * heads * (512 + 64) + 2 * heads * 512
    assert c.attn_bytes_per_kv == 576
    assert c.moe_layers == 58 and c.dense_layers == 3


def test_fp8_and_int4_weights():
    fp8 = scenario(dtype="fp8")
    assert fp8.weight_bytes == 1 and fp8.dtype_bytes == 2 and fp8.kv_bytes == 2
    assert fp8.gemm_dtype == "fp8"
    cost, c = target_cost(fp8)
    assert RooflineRates(fp8).flops_s == pytest.approx(1978.9e12 * 0.65)
    assert c.linears[0].weight_bytes == 4096 * (32 + 16) * 128 * 1
    on_a100 = scenario(dtype="fp8", hardware={"preset": "a100-80g", "gemm_corner": None})
    assert on_a100.gemm_dtype == "bf16"                           # no fp8 tensor cores: bytes only
    assert RooflineRates(on_a100).flops_s == pytest.approx(312e12 * 0.65)
    int4 = scenario(dtype="int4")
    assert int4.weight_bytes == pytest.approx(0.5 + 2.5 / 128) == INT4_WEIGHT_BYTES
    assert int4.gemm_dtype == "fp16"
    assert scenario(dtype="fp8", kv_dtype="fp8").kv_bytes == 1


def test_int4_weights_read_at_the_engines_int4_efficiency():
    # gpt-fast's int4 kernel reads weights at 0.35 of HBM bandwidth, its bf16 ones at 0.70: a
    # batch-1 layer's linears take (weight bytes / 0.35) / bandwidth.
    layer_params = 4096 * (32 + 16) * 128 + 4096 * 4096 + 3 * 4096 * 14336
    for engine, efficiency in (("gpt-fast", 0.35), ("vllm", 0.80)):
        s = scenario(dtype="int4", engine=engine)
        cost, c = target_cost(s)
        weights_s = sum(op.weight_bytes for op in c.linears) / c.bytes_s
        assert weights_s == pytest.approx(layer_params * INT4_WEIGHT_BYTES / (3350e9 * efficiency))
    bf16 = target_cost(scenario(engine="gpt-fast"))[1]       # 16-bit weights: the engine's own efficiency
    assert sum(op.weight_bytes for op in bf16.linears) / bf16.bytes_s == pytest.approx(layer_params * 2 / (3350e9 * 0.70))


def test_attention_computes_whole_query_tiles():
    # Llama-3.1-8B: 32 query heads on 8 KV heads, 4 query rows per query token and KV head.
    _, c = target_cost(scenario())
    assert c.padded_query(1) == 1                  # decode: no tile
    assert c.padded_query(4) == 4                  # 16 rows fill a 16-row tile
    assert c.padded_query(5) == 16                 # 20 rows take a 64-row tile
    assert c.padded_query(40) == 64                # 160 rows take two 128-row tiles
    assert np.array_equal(c.padded_query(np.array([1.0, 5.0, 17.0])), [1.0, 16.0, 32.0])
    # At a KV length where 16 padded tokens are compute-bound, 5 real ones cost what 16 would.
    hw = {"preset": "h100-sxm", "gemm_corner": None, "bf16_tflops": 30.0}
    _, slow = target_cost(scenario(hardware=hw))
    kv = 100_000
    compute = slow.attn_flops_per_q_kv * 16 * (kv - 2) / slow.attn_flops_s
    assert compute > (kv * slow.attn_bytes_per_kv + 5 * slow.attn_bytes_per_q) / slow.bytes_s
    assert slow.request_attention_s(5, kv) == pytest.approx(compute)
    # The memory-bound fast path stops where the padded query crosses the ridge: on the plain H100
    # (4,096 KV bytes a token, 16,384 FLOPs a query token, 643 TFLOP/s over 2,680 GB/s) at 60.0
    # tokens, which 32 query tokens (128 rows, one tile) stay under and 33 (two tiles, 64) do not.
    ridge = c.attn_bytes_per_kv * c.attn_flops_s / (c.attn_flops_per_q_kv * c.bytes_s)
    assert ridge == pytest.approx(60.0, rel=0.01) and c.query_ridge == 32
    assert slow.query_ridge == 1                   # 1.8 tokens: two already pad to four


def test_speculation_host_work():
    s = scenario(engine="hf-eager", speculation={"method": "eagle", "num_speculative_tokens": 5,
                                                 "acceptance": {"tokens_per_step": 3}})
    shares = [0.0] * len(PHASES)
    seconds = cost_model_for(s).host.speculation_overhead(4, 5, shares)
    # hf-eager's fitted 1 ms a speculative step and 1 ms a draft forward.
    assert seconds == pytest.approx(1e-3 + 5 * 1e-3)
    assert shares[OVERHEAD] == pytest.approx(1e-3) and shares[DRAFT] == pytest.approx(5e-3)
    sglang = scenario(engine="sglang", speculation={"method": "eagle", "acceptance": {"tokens_per_step": 2}})
    # SGLang's fitted 0.5 ms a speculative step and 80 us a request.
    assert cost_model_for(sglang).host.speculation_overhead(10, 3, [0.0] * len(PHASES)) == pytest.approx(0.5e-3 + 10 * 80e-6)


def test_eagle_heads_and_tree_topk():
    s = scenario(speculation={"method": "eagle", "tree": {"depth": 6, "tokens": 60, "topk": 10},
                              "acceptance": {"tokens_per_step": 3}})
    assert s.speculation.tree.tokens_per_draft_forward == 10 and s.speculation.verify_tokens == 61
    head = build_stacks(s).draft
    assert head.extra_linears == ((2 * 4096, 4096),) and head.lm_head_vocab == 128256
    mtp = build_stacks(load_scenario({"hardware": "h200", "model": "deepseek-v3", "tensor_parallel": 8,
                                      "speculation": {"method": "mtp", "acceptance": {"tokens_per_step": 1.8},
                                                      "num_speculative_tokens": 1}})).draft
    assert mtp.experts is not None and mtp.latent is not None and mtp.layers == 1
    assert mtp.moe_layers == 1 and mtp.dense_layers == 0      # the next-n layer is an MoE layer
    deeper = build_stacks(load_scenario({"hardware": "h200", "model": "deepseek-v3", "tensor_parallel": 8,
                                         "speculation": {"method": "mtp", "draft": {"layers": 2},
                                                         "acceptance": {"tokens_per_step": 1.8}}})).draft
    assert deeper.layers == 2                                  # draft.layers, when given, wins


def test_static_batches_wait_for_the_whole_batch():
    base = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
            "workload": {"concurrency": 2, "requests": 4, "prompt_tokens": 64, "output_tokens": [8, 32, 8, 32]}}
    static = simulate({**base, "scheduler": {"batching": "static"}}).baseline
    continuous = simulate(base).baseline
    # The third request starts only when the first batch's longer request ends (32 tokens).
    assert static.ttft_s[2] > continuous.ttft_s[2]
    assert static.makespan_s > continuous.makespan_s
    assert static.iterations == 2 * 32     # each batch: one prefill iteration, then 31 decode steps


def test_a_static_shape_engine_attends_over_the_longest_rows_context():
    # A short and a long request decoding together: on a padded engine both rows read the long
    # one's context (one dense KV tensor), so decoding costs what two long requests' does.
    def decode_s(prompts, pad):
        result = simulate({"hardware": "h100-sxm", "model": "llama-3.1-8b",
                           "workload": {"concurrency": 2, "requests": 2, "prompt_tokens": prompts, "output_tokens": 64},
                           "scheduler": {"pad_ragged": pad, "prefill_chunk": 131072}})
        return result.baseline.phase_s["decode"]
    assert decode_s([256, 60000], True) == pytest.approx(decode_s([60000, 60000], True), rel=1e-6)
    assert decode_s([256, 60000], False) < 0.9 * decode_s([60000, 60000], False)


def test_a_static_shape_engine_prefills_a_batch_at_its_longest_prompt():
    def prefill_s(prompts, pad):
        result = simulate({"hardware": "h100-sxm", "model": "llama-3.1-8b",
                           "workload": {"concurrency": 4, "requests": 4, "prompt_tokens": prompts, "output_tokens": 8},
                           "scheduler": {"batching": "static", "pad_ragged": pad, "prefill_chunk": 65536}})
        return result.baseline.phase_s["prefill"]
    ragged = [128, 256, 512, 8192]
    assert prefill_s(ragged, True) == pytest.approx(prefill_s([8192] * 4, True), rel=1e-6)
    assert prefill_s(ragged, False) < 0.5 * prefill_s(ragged, True)


def test_decode_only_counts_no_prefill_iteration():
    result = simulate({"hardware": "h100-sxm", "model": "llama-3.1-8b",
                       "scheduler": {"batching": "static", "prefill_chunk": 4096},
                       "workload": {"concurrency": 4, "requests": 4, "prompt_tokens": 512, "output_tokens": 17}})
    base = result.baseline
    # 4 requests x 16 tokens after the first, over the 16 decode iterations' time.
    steps = np.asarray([s for s in base_steps(result)])
    assert base.decode_throughput_tok_s == pytest.approx(4 * 16 / steps[1:].sum())


def test_decode_only_counts_output_tokens_only():
    # k = 4 with every draft accepted commits 5 tokens a step: 17 tokens end mid-step, and the
    # tokens past the end are no output.
    result = simulate({"hardware": "h100-sxm", "model": "llama-3.1-8b", "scheduler": {"batching": "static"},
                       "speculation": {"method": "eagle", "num_speculative_tokens": 4,
                                       "acceptance": {"tokens_per_step": 5}},
                       "workload": {"concurrency": 2, "requests": 2, "prompt_tokens": 64, "output_tokens": 17}})
    from sim.simulate import plan, run_pipeline

    requests, planned = plan(result.scenario)
    _, config, stacks, memory = planned[1]
    record, _ = run_pipeline(config, requests, stacks, memory)
    assert record.decode_only_tokens == 2 * 16


def test_static_batch_prefills_in_chunks_before_decoding():
    mapping = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "scheduler": {"prefill_chunk": 256},
               "workload": {"concurrency": 2, "requests": 2, "prompt_tokens": 512, "output_tokens": 9}}
    static = simulate({**mapping, "scheduler": {"batching": "static", "prefill_chunk": 256}}).baseline
    # 1,024 prompt tokens in chunks of 256: 4 prefill iterations, then 8 decode steps for both.
    assert static.iterations == 4 + 8
    # The first request's prefill ends at the second chunk, but it decodes only with the batch:
    # its 8 tokens take longer after its first token than the second request's.
    assert static.tpot_s[0] > 1.1 * static.tpot_s[1]
    continuous = simulate(mapping).baseline
    assert continuous.tpot_s[0] < static.tpot_s[0]


def base_steps(result):
    from sim.simulate import plan, run_pipeline

    s = result.scenario.with_method_none()
    requests, planned = plan(s)
    _, config, stacks, memory = planned[0]
    record, _ = run_pipeline(config, requests, stacks, memory)
    return record.step_s


@pytest.mark.parametrize("config, check", [
    ({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
      "num_key_value_heads": 8, "intermediate_size": 2048, "moe_intermediate_size": 256, "n_routed_experts": 16,
      "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 128,
      "q_lora_rank": 256, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64, "vocab_size": 1000,
      "num_nextn_predict_layers": 1},
     lambda m: (m.experts.routed, m.experts.shared, m.experts.dense_layers, m.latent.kv_rank, m.head_dim,
                m.mtp_layers) == (16, 1, 1, 128, 96, 1)),
    ({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
      "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
      "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936},
     lambda m: (m.experts.routed, m.experts.top_k, m.experts.ffn, m.experts.shared) == (128, 8, 768, 0)),
    ({"architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
      "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
      "num_experts_per_tok": 4, "vocab_size": 201088},
     lambda m: (m.experts.routed, m.experts.top_k, m.experts.ffn) == (128, 4, 2880)),
])
def test_config_json_beyond_llama(tmp_path, config, check):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert check(load_hf_config(path))


def test_moe_presets_match_their_published_sizes():
    # Total and active parameters as the model cards state them (billions).
    for name, total, active in (("deepseek-v3", 671, 37), ("qwen3-30b-a3b", 30.5, 3.3), ("mixtral-8x7b", 46.7, 12.9),
                                ("llama-4-scout-17b-16e", 109, 17)):
        m = MODELS[name]
        assert m.params / 1e9 == pytest.approx(total, rel=0.03), name
        active_params = m.layers * m.active_layer_params + m.embedding_params
        assert active_params / 1e9 == pytest.approx(active, rel=0.06), name


def test_expert_parallelism_pays_for_the_busiest_gpu():
    # Mixtral over 2 GPUs, one token: 2 of 8 experts touched. Split by tensor parallelism each GPU
    # reads half of 2 experts; placed whole (4 a GPU), the busiest GPU reads 1 + z_2 sd experts,
    # sd = sqrt(4 x 0.25 x 0.75), z_2 = Phi^-1(1.625 / 2.25) (Blom).
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1.625 / 2.25)
    expert_bytes = 3 * 4096 * 14336 * 2
    act_bytes = (2 * 4096 + 3 * 14336) * 2
    bytes_s = 3350e9 * 0.80
    hardware = {"preset": "h100-sxm", "gemm_corner": None}
    split = target_cost(scenario(hardware=hardware, model="mixtral-8x7b", tensor_parallel=2))[1]
    placed = target_cost(scenario(hardware=hardware, model="mixtral-8x7b", tensor_parallel=2, expert_parallel=True))[1]
    experts = 1 + z * math.sqrt(4 * 0.25 * 0.75)
    pairs = 1 + z * math.sqrt(2 * 0.5 * 0.5)
    assert placed.routed_time_s(1) == pytest.approx((experts * expert_bytes + pairs * act_bytes) / bytes_s)
    assert split.routed_time_s(1) == pytest.approx((2 * expert_bytes / 2 + 2 * act_bytes / 2) / bytes_s)
    # At a large batch every expert is read either way: the same bytes per GPU.
    assert placed.routed_time_s(4096) == pytest.approx(split.routed_time_s(4096), rel=0.01)
    with pytest.raises(Exception, match="expert_parallel: llama-3.1-8b has no experts"):
        scenario(expert_parallel=True)


def test_static_batch_rows_run_on_until_the_batch_ends():
    from sim.simulate import plan, run_pipeline

    s = load_scenario({"hardware": "h100-sxm", "model": "llama-3.1-8b", "scheduler": {"batching": "static"},
                       "workload": {"concurrency": 2, "requests": 2, "prompt_tokens": 64, "output_tokens": [8, 32]}})
    requests, planned = plan(s)
    _, config, stacks, memory = planned[0]
    record, _ = run_pipeline(config, requests, stacks, memory)
    # One prefill, then 31 steps; the first request is done after 7 of them but its row runs on.
    assert record.decoding[1:] == [2] * 31
    assert record.finish_s[0] < record.finish_s[1]
    assert record.decode_only_tokens == 7 + 31


def test_static_batch_ending_at_its_first_finish_keeps_what_each_row_committed():
    from sim.simulate import plan, run_pipeline

    s = load_scenario({"hardware": "h100-sxm", "model": "llama-3.1-8b",
                       "scheduler": {"batching": "static", "static_end": "first"},
                       "workload": {"concurrency": 2, "requests": 4, "prompt_tokens": 64, "output_tokens": [8, 32]}})
    requests, planned = plan(s)
    _, config, stacks, memory = planned[0]
    record, _ = run_pipeline(config, requests, stacks, memory)
    # Each batch: one prefill, then 7 steps; the 8-token request ends the batch and the 32-token
    # one leaves with the 8 tokens it has (the first at prefill, one per step).
    assert record.decoding == [0] + [2] * 7 + [0] + [2] * 7
    assert record.output_tokens.tolist() == [8, 8, 8, 8]
    assert requests.output_tokens.tolist() == [8, 32, 8, 32]     # the workload itself is untouched
    assert record.decode_only_tokens == 4 * 7
    assert record.finish_s[0] == record.finish_s[1] < record.finish_s[2] == record.finish_s[3]
    with pytest.raises(Exception, match="static_end applies to batching: static"):
        load_scenario({"scheduler": {"static_end": "first"}})


def test_a_draft_model_with_a_kv_budget_reads_only_its_window():
    # MagicDec's standalone drafts keep a StreamingLLM cache: a TinyLlama draft over 8,000-token
    # contexts reads 512 tokens of KV per request, and holds 512 per running request in memory.
    spec = {"method": "draft_model", "acceptance": {"rate": 0.6}, "draft": {"model": "tinyllama-1.1b"}}
    full = scenario(model="llama-2-7b", speculation=spec)
    windowed = scenario(model="llama-2-7b", speculation=spec | {"draft": {"model": "tinyllama-1.1b", "kv_budget": 512}})
    assert build_stacks(full).draft.kv_window is None
    assert build_stacks(windowed).draft.kv_window == 512
    assert build_stacks(scenario(speculation={"method": "streaming", "acceptance": {"rate": 0.6}})).draft.kv_window == 512
    # A full dump (every default written out) reloads to the same draft: no window appears.
    assert build_stacks(load_scenario(full.model_dump(mode="json"))).draft.kv_window is None
    cost = cost_model_for(windowed)
    draft = build_stacks(windowed).draft
    c = cost.pricer(draft).c
    shares = [0.0] * len(PHASES)
    context = np.full(4, 8000)
    seconds = cost.forward_uniform(draft, DRAFT, 4, 1, int(context.sum()), shares, context=context)
    shared, lm_head = cost.pricer(draft).rates.batch_terms_s(c, 4, 4)
    kv_s = 4 * 512 * c.attn_bytes_per_kv / c.bytes_s + 4 * c.attn_bytes_per_q / c.bytes_s
    assert seconds == pytest.approx(shared + lm_head + draft.layers * kv_s)
    tiny = MODELS["tinyllama-1.1b"]
    result = simulate(windowed.model_dump(exclude_unset=True) | {"workload": {"concurrency": 2, "requests": 2,
                                                                            "prompt_tokens": 4000, "output_tokens": 8}})
    per_token_target = kv_bytes_per_token(MODELS["llama-2-7b"], 1, 2)
    assert result.memory["kv_capacity_tokens"] == pytest.approx(
        simulate(full.model_dump(exclude_unset=True) | {"workload": {"concurrency": 2, "requests": 2, "prompt_tokens": 4000,
                                                                    "output_tokens": 8}}).memory["kv_capacity_tokens"]
        * (per_token_target + kv_bytes_per_token(tiny, 1, 2)) / per_token_target, rel=0.01)


def test_decoding_tokens_come_out_of_the_prefill_budget_where_the_engine_counts_them(tmp_path):
    # Request 0 (3 tokens) decodes, one token a step or 1 + k verified with speculation, while
    # request 1's 128-token prompt is prefilled in 64-token iterations: 2 chunks when prompts have
    # the budget to themselves, 3 when the decoding tokens come out of it first (vLLM, llama.cpp).
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,64,3\n0.000001,128,8\n")
    mapping = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
               "workload": {"arrival": "trace", "trace": str(trace)},
               "speculation": {"method": "ngram", "num_speculative_tokens": 3, "acceptance": {"tokens_per_step": 2.0}}}
    shared = simulate({**mapping, "scheduler": {"prefill_chunk": 64}})
    counted = simulate({**mapping, "scheduler": {"prefill_chunk": 64, "budget_includes_decode": True}})
    for run in ("baseline", "run"):
        a, b = getattr(shared, run), getattr(counted, run)
        assert a.ttft_s[0] == b.ttft_s[0]
        assert b.ttft_s[1] > a.ttft_s[1]
        assert b.iterations == a.iterations + 1


def test_arrival_times_inline_and_prompt_chunks_as_forwards_of_their_own(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,64,3\n0.5,128,8\n")
    base = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": VLLM_BEFORE_57}
    from_file = simulate({**base, "workload": {"arrival": "trace", "trace": str(trace)}})
    inline = simulate({**base, "workload": {"arrival": "trace", "arrival_s": [0, 0.5], "prompt_tokens": [64, 128],
                                            "output_tokens": [3, 8]}})
    np.testing.assert_array_equal(inline.run.ttft_s, from_file.run.ttft_s)
    # Two prompts prefilled in one iteration: one target forward (mixed), or one each (the live
    # engine's continuous batching): the weights are read twice, the first token comes later.
    together = {**base, "workload": {"arrival": "trace", "arrival_s": [0, 0], "prompt_tokens": [64, 128],
                                     "output_tokens": [3, 8]}}
    mixed = simulate(together)
    separate = simulate({**together, "scheduler": {"prefill_forward": "per_request"}})
    assert separate.run.iterations == mixed.run.iterations
    assert separate.run.ttft_s[0] > 1.5 * mixed.run.ttft_s[0]
    with pytest.raises(Exception, match="arrival_s goes with arrival: trace"):
        simulate({**base, "workload": {"arrival_s": [0, 1]}})
