"""aiconfigurator-core's measured operator tables as the simulator finds them: where the package
installed them, by GPU preset, engine and version, with the package's current version marked, and
`sim tables` printing that coverage (bad input one line, exit 2)."""
import subprocess
import sys

import pyarrow.parquet as pq

from conftest import REPO
from sim.cost.operator_tables import FRAMEWORKS, coverage, data_root, package_provenance, table_sets, version_key
from sim.scenario.presets.hardware import HARDWARE

GPUS = {name: spec.operator_tables for name, spec in HARDWARE.items() if spec.operator_tables}


def test_the_tables_are_read_where_the_package_installed_them():
    root = data_root()
    assert root is not None and (root / "h100_sxm").is_dir()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert not [path for path in tracked if path.endswith("_perf.parquet")]     # nothing copied into the repository
    sets = table_sets()
    assert sets and all((s.folder / f"{t}.parquet").is_file() for s in sets for t in s.tables)
    # A table's rows say which framework, version and GPU measured them, as its folder does.
    gemm = next(s for s in sets if (s.system, s.family, s.framework) == ("h100_sxm", "gemm", "vllm")
                and s.version == "0.24.0")
    rows = pq.read_table(gemm.folder / "gemm_perf.parquet", columns=["framework", "version", "device"]).to_pandas()
    assert set(rows.framework.str.lower()) == {"vllm"} and set(rows.version) == {"0.24.0"}
    assert set(rows.device) == {"NVIDIA H100 80GB HBM3"}
    assert package_provenance() == {"package": "aiconfigurator-core", "version": "0.12.0", "licence": "Apache-2.0"}


def test_coverage_lists_every_preset_with_tables_by_engine_and_version_the_current_one_marked():
    rows = coverage(GPUS)
    assert {r["gpu"] for r in rows} == {"h100-sxm", "h200", "b200", "gb200", "a100-80g"}
    assert {r["engine"] for r in rows} == set(FRAMEWORKS)
    for gpu in ("h100-sxm", "h200", "b200"):
        for engine in FRAMEWORKS:
            current = [r for r in rows if r["gpu"] == gpu and r["engine"] == engine and r["current"]]
            assert len(current) == 1 and {"gemm", "attention", "moe", "comm"} <= set(current[0]["families"])
    h100_sglang = [r["version"] for r in rows if r["gpu"] == "h100-sxm" and r["engine"] == "sglang"]
    assert h100_sglang == sorted(h100_sglang, key=version_key) and h100_sglang.index("0.5.9") < h100_sglang.index("0.5.10")


def sim_tables(*argv):
    return subprocess.run([sys.executable, "-m", "sim", "tables", *argv], cwd=REPO, capture_output=True, text=True)


def test_sim_tables_prints_the_coverage_and_bad_input_is_one_line():
    done = sim_tables("--gpu", "h200", "--engine", "vllm")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("aiconfigurator-core 0.12.0 (Apache-2.0)")
    assert all(line.split()[0] == "h200" and line.split()[2] == "vllm" for line in lines[1:])
    assert any("0.24.0" in line and "*" in line and "gemm" in line for line in lines[1:])
    for argv, message in [(("--gpu", "rtx-4090"), "error: --gpu: aiconfigurator-core has no tables of rtx-4090"),
                          (("--gpu", "h1000"), "error: --gpu: h1000 is no hardware preset"),
                          (("--engine", "llama.cpp"), "error: --engine: aiconfigurator-core has no tables of engine")]:
        done = sim_tables(*argv)
        assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
