"""Expert parallelism's all-to-all priced from a published table (DeepEP's low-latency kernels),
the guess where the engine names none, and the importer's hold-out for a table of one size per
GPU count."""
import subprocess
import sys

import pytest

from conftest import REPO
from sim.cost.collectives import ALLREDUCE_LATENCY_S
from sim.cost.model import cost_model_for
from sim.cost.roofline import RooflineRates
from sim.cost.stack import build_stacks
from sim.errors import InputError
from sim.formats.published import load_published
from sim.scenario import load_scenario

DEEPEP = "deepep-ll-h800"


def moe_scenario(engine="sglang", expert_parallel=True, tp=8, cost="auto"):
    return load_scenario({"hardware": "h100-sxm", "model": "deepseek-v3", "dtype": "fp8", "tensor_parallel": tp,
                          "expert_parallel": expert_parallel, "engine": engine, "cost": cost})


def target_cost(scenario):
    rates = RooflineRates(scenario)
    return rates, rates.stack_cost(build_stacks(scenario).target)


def test_an_expert_parallel_moe_layer_pays_the_tables_dispatch_and_combine_instead_of_its_second_all_reduce():
    scenario = moe_scenario({"preset": "sglang", "all_to_all": DEEPEP})
    rates, c = target_cost(scenario)
    exchange = lambda tokens: (rates.collectives_time_s(c, tokens)
                               - (61 + 3) * rates.allreduce_time_s(tokens * 7168 * scenario.dtype_bytes)) / 58
    # DeepEP's own point, 128 tokens a GPU on 8 GPUs: its 77 us dispatch (FP8) and 114 us combine
    # (BF16), whatever the scenario's activation width.
    assert exchange(8 * 128) == pytest.approx(77e-6 + 114e-6)
    # Fewer tokens: the 128-token time (an upper bound); 1,024 a GPU: 8x the bytes, 8x the time.
    assert exchange(8 * 4) == pytest.approx(77e-6 + 114e-6)
    assert exchange(8 * 1024) == pytest.approx(8 * (77e-6 + 114e-6))
    model = cost_model_for(scenario)
    assert model.origins()["all_to_all"].startswith(f"published: calibration/published/{DEEPEP}, deepep")
    # Measured on H800s (the h100-sxm preset): an H200 scenario is told so.
    h200 = load_scenario({"hardware": "h200", "model": "deepseek-v3", "dtype": "fp8", "tensor_parallel": 8,
                          "expert_parallel": True, "engine": {"preset": "sglang", "all_to_all": DEEPEP}})
    assert not any("all-to-all" in w for w in model.warnings)
    assert any(f"all-to-all priced by {DEEPEP}, measured on h100-sxm over infiniband-400g; the scenario's GPUs "
               f"are h200" in w for w in cost_model_for(h200).warnings)


def test_without_a_named_table_the_guess_prices_it_and_the_result_says_so():
    scenario = moe_scenario("sglang", cost="roofline")
    rates, c = target_cost(scenario)
    message = 4 * 8 * 7168 * scenario.dtype_bytes
    guess = 2 * (ALLREDUCE_LATENCY_S + 7 / 8 * message / 450e9)
    reduce = rates.allreduce_time_s(32 * 7168 * scenario.dtype_bytes)
    assert rates.collectives_time_s(c, 32) == pytest.approx(64 * reduce + 58 * guess)
    assert any("all-to-all priced by the roofline's guess: engine sglang names no published" in w
               for w in cost_model_for(scenario).warnings)
    # With the measured operator tables, DeepEP's kernels as they timed them on 8 H100s; no warning.
    measured = cost_model_for(moe_scenario("sglang"))
    assert "DeepEP" in measured.all_to_all.origin and not any("all-to-all" in w for w in measured.warnings)
    # Tensor-parallel experts have no all-to-all: two all-reduces a layer, no warning.
    tp_only = moe_scenario("sglang", expert_parallel=False)
    rates, c = target_cost(tp_only)
    assert rates.collectives_time_s(c, 32) == pytest.approx(2 * 61 * rates.allreduce_time_s(32 * 7168 * tp_only.dtype_bytes))
    assert not any("all-to-all" in w for w in cost_model_for(tp_only).warnings)


def test_a_gpu_count_the_table_did_not_measure_takes_the_guess_with_a_warning():
    scenario = moe_scenario({"preset": "sglang", "all_to_all": DEEPEP}, tp=4)
    assert any(f"{DEEPEP} measured [8, 16, 32, 64, 256] GPUs, the scenario runs 4" in w
               for w in cost_model_for(scenario).warnings)


@pytest.mark.parametrize("name", ["nowhere", "vidur-a100-host", "nccl-h100-dgx", 7])
def test_an_all_to_all_that_is_not_a_published_dispatch_table_is_bad_input(name):
    with pytest.raises(InputError, match="engine.all_to_all: must name a published collectives table with "
                                         "dispatch and combine"):
        moe_scenario({"preset": "sglang", "all_to_all": name})


def transcribed(path, counts):
    lines = ["op,ranks,elements,dtype_bytes,ms,library"]
    for op, per in (("dispatch", 0.010), ("combine", 0.015)):
        lines += [f"{op},{r},1024,2,{per * (1 + r / 64):.4f},deepep" for r in counts]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_import(csv, out):
    return subprocess.run([sys.executable, "-m", "sim", "import-profile", "collectives-csv", str(csv), "--out", str(out),
                           "--library", "deepep", "--hardware", "h100-sxm", "--interconnect", "infiniband-400g",
                           "--repository", "https://example.org/ep", "--path", "README", "--commit", "2025-01-01",
                           "--licence", "MIT"], cwd=REPO, capture_output=True, text=True)


def test_a_table_of_one_size_per_gpu_count_holds_out_every_fifth_gpu_count(tmp_path):
    proc = run_import(transcribed(tmp_path / "t.csv", (8, 16, 32, 64, 128, 256)), tmp_path / "ep")
    assert proc.returncode == 0, proc.stderr
    profile = load_published(tmp_path / "ep")
    assert [int(r) for r in profile.table("dispatch").axes[0]] == [8, 16, 32, 64, 256]
    assert profile.meta["held_out"]["dispatch"]["rows"] == 1
    assert profile.meta["element_bytes"] == {"dispatch": 2.0, "combine": 2.0}
    proc = run_import(transcribed(tmp_path / "few.csv", (8, 16, 32)), tmp_path / "few")
    assert proc.returncode == 2 and "too few rows to hold any out" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "few").exists()
