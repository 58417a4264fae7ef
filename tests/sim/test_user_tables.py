"""A user's own operator tables: a calibration bundle's times written in the published tables' layout
(sim/formats/operator_layout.py), read back by the same loader, and laid over the package's tables
for the GPU they were timed on (a scenario's `operator_tables`)."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from sim.cost.measured_tables import operator_tables
from sim.cost.operator_tables import data_root
from sim.errors import InputError
from sim.formats.operator_layout import user_tables_root, write_operator_layout
from sim.simulate import simulate

CPU_BUNDLE = REPO / "calibration/cpu/smollm2-135m"
WORKLOAD = {"concurrency": 1, "requests": 2, "prompt_tokens": 200, "output_tokens": 16}


@pytest.fixture(scope="module")
def cpu_layout(tmp_path_factory):
    """The committed CPU bundle's times in the tables' layout, as `profiler calibrate` writes them."""
    meta = json.loads((CPU_BUNDLE / "meta.json").read_text())
    frame = pd.read_parquet(CPU_BUNDLE / "profile.parquet")
    root = tmp_path_factory.mktemp("layout")
    write_operator_layout(root, frame, meta)
    return root, frame[~frame.held_out]


def test_a_bundles_tables_are_read_back_by_the_loader_at_its_measured_points(cpu_layout):
    root, frame = cpu_layout
    tables = operator_tables("cpu", "live", None, root)
    assert tables is not None and tables.framework == "live" and set(tables.overrides) == \
        {"gemm_perf", "generation_attention_perf", "context_attention_perf"}
    # SmolLM2: hidden 576, 9 query and 3 KV heads of 64, so the QKV projection is 576 -> 960.
    qkv = frame[frame.op == "linear.qkv"]
    gemm = tables.gemm("float32")
    for _, row in qkv.iterrows():
        assert gemm.lookup(576, row.tokens, 960)[0] == pytest.approx(row.seconds, rel=1e-9)
    decode = frame[(frame.op == "attention") & (frame["query"] == 1)]
    generation = tables.attention("generation_attention_perf", 9, 3, 64, "float32")
    assert generation.exact
    for _, row in decode.iterrows():
        assert generation.grid.lookup(row.batch, row.kv)[0] == pytest.approx(row.seconds, rel=1e-9)
    assert tables.provenance["tables"]["gemm_perf"]["source"] == "user"


def test_a_device_the_package_lacks_is_priced_from_the_users_tables(cpu_layout):
    root, _ = cpu_layout
    scenario = {"hardware": "cpu", "model": "smollm2-135m", "dtype": "fp32", "workload": WORKLOAD}
    assert simulate(scenario).provenance["cost_model"] == "roofline"
    result = simulate({**scenario, "operator_tables": str(root), "cost": "measured"})
    assert result.provenance["cost_model"].startswith("measured:cpu/live/0.1.0")
    terms = result.provenance["cost_origins"]["terms"]["target"]
    assert terms["linears"] == {"measured": terms["linears"]["measured"]} and terms["attention"].get("measured")


@pytest.mark.skipif(data_root() is None, reason="aiconfigurator-core is not installed")
def test_a_users_table_overrides_the_packages_for_its_gpu_and_only_that_table(tmp_path):
    published = pd.read_parquet(data_root() / "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet")
    folder = tmp_path / "h100_sxm/gemm/vllm/0.24.0"
    folder.mkdir(parents=True)
    published.assign(latency=published.latency * 2).to_parquet(folder / "gemm_perf.parquet")
    package = operator_tables("h100_sxm", "vllm", "0.24.0")
    user = operator_tables("h100_sxm", "vllm", "0.24.0", tmp_path)
    point = (4096, 8, 6144)
    assert user.gemm("bfloat16").lookup(*point)[0] == pytest.approx(2 * package.gemm("bfloat16").lookup(*point)[0])
    assert user.attention("generation_attention_perf", 32, 8, 128, "bfloat16").grid.lookup(8, 1024) == \
        package.attention("generation_attention_perf", 32, 8, 128, "bfloat16").grid.lookup(8, 1024)
    scenario = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "workload": WORKLOAD}
    plain, overlaid = simulate(scenario), simulate({**scenario, "operator_tables": str(tmp_path)})
    assert overlaid.baseline.throughput_tok_s < 0.8 * plain.baseline.throughput_tok_s
    tables = overlaid.provenance["cost_origins"]["operator_tables"]
    assert tables["tables"]["gemm_perf"]["source"] == "user"
    assert tables["tables"]["generation_attention_perf"]["source"] == "package"
    assert "+user:" in overlaid.provenance["cost_model"] and not tables["user_tables"].startswith("/")     # repo-relative
    # Another GPU keeps the package's tables.
    h200 = simulate({**scenario, "hardware": "h200", "operator_tables": str(tmp_path)})
    assert "+user:" not in h200.provenance["cost_model"]


def test_a_missing_or_empty_tables_folder_is_one_line_of_bad_input(tmp_path):
    with pytest.raises(InputError, match="operator_tables: no such folder"):
        user_tables_root(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    run = subprocess.run([sys.executable, "-m", "sim", "run", str(REPO / "scenarios/eagle-h100.yaml"), "--set",
                          f"operator_tables={tmp_path / 'empty'}"], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().count("\n") == 0 and "operator_tables:" in run.stderr and "holds no table" in run.stderr
