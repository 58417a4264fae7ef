"""An engine's host work from a published host table (Vidur's cpu_overheads.csv): the importer,
and an engine preset that names one pricing each step's host work from it."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from sim.cost.batch import OVERHEAD, PHASES
from sim.cost.model import cost_model_for
from sim.errors import InputError
from sim.formats.published import load_published
from sim.scenario import load_scenario

HOST = "calibration/published/vidur-a100-host"
PARTS = {"schedule_median": 0.15, "prepare_inputs_e2e_median": 0.3, "sampler_e2e_median": 0.5,
         "process_model_outputs_median": 0.17, "ray_comm_time_mean": 0.2}
SOURCE = ["--repository", "https://example.org/profiles", "--path", "a100/cpu_overheads.csv", "--commit", "0123abcd",
          "--licence", "MIT", "--hardware", "a100-80g"]


def cpu_overheads(path, negative=False):
    """A cpu_overheads.csv in Vidur's columns: two models a tensor-parallel size (the second's
    parts 1.5x the first's), batch 8-128, every part a + 0.01 ms a request."""
    rows = []
    for tp, models in ((1, ("a", "b")), (2, ("c", "d"))):
        for m, model in enumerate(models):
            for batch in range(8, 129, 8):
                row = {"model_name": model, "batch_size": batch, "tensor_parallel_degree": tp}
                for column, ms in PARTS.items():
                    row[column] = (ms + 0.01 * batch) * (1.5 if m else 1.0) * tp
                rows.append(row)
    frame = pd.DataFrame(rows)
    if negative:
        frame.loc[5, "sampler_e2e_median"] = -1.0
    frame.to_csv(path)
    return path


def run_import(csv, out, *extra):
    return subprocess.run([sys.executable, "-m", "sim", "import-profile", "vidur-cpu-overheads", str(csv),
                           "--out", str(out), *SOURCE, *extra], cwd=REPO, capture_output=True, text=True)


def test_an_imported_host_table_takes_each_part_at_the_median_over_its_models(tmp_path):
    proc = run_import(cpu_overheads(tmp_path / "c.csv"), tmp_path / "host", "--engine", "engine X")
    assert proc.returncode == 0, proc.stderr
    profile = load_published(tmp_path / "host")
    assert profile.kind == "host" and profile.meta["engine"] == "engine X"
    assert set(profile.tables) == {"schedule", "prepare_inputs", "sampler", "process_outputs", "ray_comm"}
    # The median of two models is their mean: 1.25x the first's, in seconds; at TP 2, twice.
    assert profile.table("sampler")(1, 64) == pytest.approx((0.5 + 0.64) * 1.25e-3, rel=1e-9)
    assert profile.table("schedule")(2, 64) == pytest.approx((0.15 + 0.64) * 2.5e-3, rel=1e-9)
    held = profile.meta["held_out"]["schedule"]
    assert held["rows"] == 6 and held["within_target"]


@pytest.mark.parametrize("extra,negative,message", [
    ((), False, "--engine: a host table needs the engine whose iterations it timed"),
    (("--engine", "X"), True, "sampler_e2e_median must be a positive number"),
])
def test_a_host_table_without_its_engine_or_with_a_negative_time_is_one_line(tmp_path, extra, negative, message):
    proc = run_import(cpu_overheads(tmp_path / "c.csv", negative=negative), tmp_path / "out", *extra)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def step_host_s(scenario, requests):
    shares = [0.0] * len(PHASES)
    seconds = cost_model_for(scenario).host.step_overhead(requests, shares)
    assert shares[OVERHEAD] == pytest.approx(seconds)
    return seconds


def test_an_engine_naming_a_host_table_pays_its_parts_at_the_steps_batch():
    scenario = load_scenario({"hardware": "a100-80g", "model": "llama-2-7b", "engine": "vllm-v0"})
    profile = load_published(REPO / HOST)
    for batch in (8, 24, 100):
        assert step_host_s(scenario, batch) == pytest.approx(sum(t(1, batch) for t in profile.tables.values()))
    # Vidur's Sarathi-Serve engine on one A100 (its Ray round trip included): 1.4 ms at batch 8 to
    # 7.2 ms at 128, growing with the batch; below the smallest batch measured, its time.
    assert 1.0e-3 < step_host_s(scenario, 8) < step_host_s(scenario, 64) < step_host_s(scenario, 128) < 8e-3
    assert step_host_s(scenario, 1) == step_host_s(scenario, 8)
    model = cost_model_for(scenario)
    assert model.origins()["host"].startswith(f"published: {HOST}, Sarathi-Serve")
    # The preset's constants where no table is named: vLLM's 1.207 ms + 6 us a request.
    vllm = load_scenario({"hardware": "a100-80g", "model": "llama-2-7b", "engine": "vllm"})
    assert step_host_s(vllm, 8) == pytest.approx(1.207e-3 + 8 * 6e-6)


def test_a_tensor_parallel_size_the_table_did_not_measure_takes_the_nearest_below_and_warns():
    at_4 = load_scenario({"hardware": "a100-80g", "model": "llama-2-70b", "engine": "vllm-v0", "tensor_parallel": 4})
    at_8 = load_scenario({"hardware": "a100-80g", "model": "llama-2-70b", "engine": "vllm-v0", "tensor_parallel": 8})
    assert step_host_s(at_8, 32) == pytest.approx(step_host_s(at_4, 32))
    assert any("host work of tensor_parallel 8 priced at 4" in w for w in cost_model_for(at_8).warnings)
    assert not any("host work" in w for w in cost_model_for(at_4).warnings)


@pytest.mark.parametrize("name", ["nowhere", "nccl-a100-dgx", 3])
def test_a_host_profile_that_is_not_a_published_host_table_is_bad_input(name):
    with pytest.raises(InputError, match="engine.host_profile: must name a published host table"):
        load_scenario({"hardware": "a100-80g", "model": "llama-2-7b",
                       "engine": {"preset": "vllm", "host_profile": name}})


def test_the_run_json_names_the_host_tables_origin(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("hardware: a100-80g\nmodel: llama-2-7b\nengine: vllm-v0\n"
                    "workload: {requests: 8, concurrency: 4, prompt_tokens: 64, output_tokens: 16}\n"
                    "speculation: {method: eagle, num_speculative_tokens: 3, acceptance: {rate: 0.7}}\n")
    proc = subprocess.run([sys.executable, "-m", "sim", "run", str(path), "--json"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    origins = json.loads(proc.stdout)["provenance"]["cost_origins"]
    assert origins["host"].startswith(f"published: {HOST}")


def test_an_engine_constant_the_host_table_replaces_is_bad_input_beside_it():
    with pytest.raises(InputError, match="engine.step_overhead_s: has no effect beside host_profile 'vidur-a100-host'"):
        load_scenario({"hardware": "a100-80g", "model": "llama-2-7b",
                       "engine": {"preset": "vllm-v0", "step_overhead_s": 1e-3}})
    # Without the table the constant prices the step again.
    plain = load_scenario({"hardware": "a100-80g", "model": "llama-2-7b",
                           "engine": {"preset": "vllm-v0", "host_profile": "", "step_overhead_s": 1e-3}})
    assert step_host_s(plain, 8) == pytest.approx(1e-3 + 8 * 6e-6)


def test_only_a_host_table_names_an_engine(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sim", "import-profile", "collectives-csv",
                           str(REPO / "calibration/published/sources/deepep-v1-low-latency-h800.csv"),
                           "--out", str(tmp_path / "x"), *SOURCE, "--interconnect", "infiniband-400g",
                           "--library", "deepep", "--engine", "SGLang"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "--engine: only host tables name an engine" in proc.stderr
