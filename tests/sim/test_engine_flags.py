"""A layout in SGLang's and vLLM's launch flags (sim/scenario/engine_flags.py): read into the
scenario's fields, written back from them, the same layout both ways."""
import pytest

from sim.errors import InputError
from sim.scenario.engine_flags import launch_flags, layout_from_flags
from sim.scenario.load import load_scenario

DEEPSEEK = {"hardware": "h200", "model": "deepseek-v3", "dtype": "fp8"}
LAYOUTS = [(8, 1, False, 0, False), (1, 16, True, 0, False), (2, 8, True, 0, True), (1, 72, True, 32, True),
           (4, 4, False, 0, False)]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("tp,dp,ep,redundant,overlap", LAYOUTS)
def test_a_layout_written_as_flags_reads_back_as_itself(engine, tp, dp, ep, redundant, overlap):
    hardware = DEEPSEEK["hardware"] if tp * dp <= 64 else "gb200"
    scenario = load_scenario({**DEEPSEEK, "hardware": hardware, "tensor_parallel": tp, "data_parallel": dp,
                              "expert_parallel": ep, "redundant_experts": redundant,
                              "engine": {"preset": engine, "two_batch_overlap": overlap}})
    flags = launch_flags(scenario)[engine]
    assert layout_from_flags(engine, f"serve deepseek-ai/DeepSeek-V3 {flags} --trust-remote-code") == {
        "tensor_parallel": tp, "data_parallel": dp, "expert_parallel": ep, "redundant_experts": redundant,
        **({"two_batch_overlap": True} if overlap else {})}


def test_sglang_counts_every_gpu_in_tp_where_vllm_counts_a_rank():
    sglang = load_scenario({**DEEPSEEK, "engine": "sglang",
                            "engine_flags": "--tp 16 --dp 16 --enable-dp-attention --ep-size 16"})
    vllm = load_scenario({**DEEPSEEK, "engine": "vllm",
                          "engine_flags": "--tensor-parallel-size=1 --data-parallel-size=16 --enable-expert-parallel"})
    assert sglang.layout == vllm.layout == "DP16 x TP1 attention, EP16"


@pytest.mark.parametrize("mapping,message", [
    ({"engine": "sglang", "engine_flags": "--tp 16 --dp 2"}, "engine_flags: --dp without --enable-dp-attention"),
    ({"engine": "sglang", "engine_flags": "--tp 16 --ep-size 4"}, "engine_flags: --ep-size 4: experts over all 16"),
    ({"engine": "sglang", "tensor_parallel": 8, "engine_flags": "--tp 16 --dp 16 --enable-dp-attention"},
     "tensor_parallel: 8 but engine_flags says 1"),
    ({"engine": "tensorrt-llm", "engine_flags": "--tp 8"}, "engine_flags: reads SGLang's or vLLM's flags"),
    ({"engine": "vllm", "engine_flags": "--tensor-parallel-size two"}, "engine_flags: --tensor-parallel-size needs a count"),
])
def test_flags_that_name_no_layout_here_are_one_line(mapping, message):
    with pytest.raises(InputError) as error:
        load_scenario({**DEEPSEEK, **mapping})
    assert str(error.value).startswith(message)
