"""Published GPU profiles as tables the simulator prices with: the importer (its held-out check,
provenance and bad input), the committed tables' own check, and collectives priced from them."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from sim.cost.batch import DECODE, PHASES, uniform_group
from sim.cost.collectives import ALLREDUCE_LATENCY_S, collectives_for
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.formats.published import HELD_OUT_TARGET, grid_table, load_published
from sim.scenario import load_scenario

PUBLISHED = REPO / "calibration/published"
SOURCE = ["--repository", "https://example.org/profiles", "--path", "network/x", "--commit", "0123456789abcdef",
          "--licence", "MIT", "--hardware", "a100-80g", "--interconnect", "nvlink3"]


def vidur_table(path, op="all_reduce", seconds_ms=None, drop=()):
    """A collective CSV in Vidur's columns: 2, 4 and 8 GPUs on one node (and 8 over two nodes, which
    the importer leaves out), sizes 2 KB to 64 MB every 1/16 octave, an alpha-beta law with noise."""
    rng = np.random.default_rng(0)
    rows = []
    for ranks, per_node in ((2, 2), (4, 4), (8, 8), (8, 4)):
        for size in np.unique(np.round(2048 * 2 ** (np.arange(0, 15 * 16 + 1) / 16))):
            ms = 0.02 + 2 * (ranks - 1) / ranks * size / 150e9 * 1e3
            ms *= (1 + 0.02 * rng.standard_normal()) * (3 if per_node != ranks else 1)
            rows.append({"time_stats.%s.median" % op: ms, "rank": 0, "num_workers": ranks, "size": int(size),
                         "collective": op, "devices_per_node": per_node, "max_devices_per_node": 8})
    frame = pd.DataFrame(rows)
    if seconds_ms is not None:
        frame.loc[3, f"time_stats.{op}.median"] = seconds_ms
    frame.drop(columns=list(drop)).to_csv(path)
    return path


def run_import(*args):
    return subprocess.run([sys.executable, "-m", "sim", "import-profile", "vidur-collectives", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True)


def test_an_imported_table_holds_out_its_fifth_rows_and_records_its_source(tmp_path):
    out = tmp_path / "profile"
    proc = run_import(vidur_table(tmp_path / "all_reduce.csv"), "--out", out, *SOURCE)
    assert proc.returncode == 0, proc.stderr
    profile = load_published(out)
    meta = profile.meta
    assert meta["source"]["commit"] == "0123456789abcdef" and meta["source"]["licence"] == "MIT"
    assert (meta["hardware"], meta["interconnect"], meta["library"]) == ("a100-80g", "nvlink3", "nccl")
    assert set(meta["measured"]) == {"seconds", "bytes", "ranks"}
    table = profile.table("all_reduce")
    # The two-node rows are left out: 8 GPUs read the one-node law, not three times it.
    assert list(table.axes[0]) == [2, 4, 8]
    assert table(8, 1 << 20) == pytest.approx(2e-5 + 1.75 * (1 << 20) / 150e9, rel=0.05)
    held = meta["held_out"]["all_reduce"]
    assert held["rows"] == pytest.approx(3 * 241 / 5, abs=3)
    assert held["median_abs_error"] < 0.03 and held["within_target"]
    assert "all_reduce" in proc.stdout and "wrote" in proc.stdout


@pytest.mark.parametrize("case,message", [
    ({"drop": ("size",)}, "lacks columns size"),
    ({"seconds_ms": -0.5}, "must be a positive number"),
    ({"interconnect": "carrier-pigeon"}, "unknown interconnect 'carrier-pigeon'"),
])
def test_bad_tables_are_one_line_and_exit_2(tmp_path, case, message):
    csv = vidur_table(tmp_path / "t.csv", seconds_ms=case.get("seconds_ms"), drop=case.get("drop", ()))
    source = list(SOURCE)
    if "interconnect" in case:
        source[source.index("nvlink3")] = case["interconnect"]
    proc = run_import(csv, "--out", tmp_path / "out", *source)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", sorted(p.name for p in PUBLISHED.iterdir() if (p / "meta.json").is_file()))
def test_each_committed_profile_predicts_its_held_out_rows_within_ten_percent(name):
    """Each table's own check, from its files: every fifth of the source's sizes (token counts) was
    kept out of the grid; the grid's interpolation there against the source's row."""
    profile = load_published(PUBLISHED / name)
    frame = pd.read_parquet(PUBLISHED / name / "profile.parquet")
    for op, spec in profile.meta["grid"].items():
        table = grid_table(op, spec, frame[(frame.op == op) & ~frame.held_out])
        held = frame[(frame.op == op) & frame.held_out]
        errors = np.abs([table(*(getattr(r, d) for d in spec["dims"])) / r.seconds - 1 for r in held.itertuples()])
        assert len(errors) >= 1      # DeepEP's table: one GPU count held out an op; the others three or more
        assert np.median(errors) <= HELD_OUT_TARGET
        assert np.median(errors) == pytest.approx(profile.meta["held_out"][op]["median_abs_error"])


def tp_scenario(**over):
    # The published collectives beside the roofline (cost: roofline; the measured operator tables'
    # own all-reduce is tests/sim/test_measured.py's).
    scenario = {"hardware": "a100-80g", "model": "llama-2-7b", "engine": "gpt-fast", "tensor_parallel": 8,
                "cost": "roofline"}
    scenario.update(over)
    return load_scenario(scenario)


def test_an_nccl_engine_on_a_measured_interconnect_pays_the_published_all_reduce():
    scenario = tp_scenario()
    collectives, warning = collectives_for(scenario)
    assert warning is None
    table = load_published(PUBLISHED / "nccl-a100-dgx").table("all_reduce")
    message = 4096 * 2                    # one token's hidden state in bf16
    assert collectives.all_reduce_s(message, 8) == table(8, message)
    cost = cost_model_for(scenario)
    target = build_stacks(scenario).target
    shares = [0.0] * len(PHASES)
    measured = cost.forward(target, [uniform_group(DECODE, 1, 1, 1000)], shares)
    guessed = cost_model_for(tp_scenario(engine={"preset": "gpt-fast", "collectives": "custom"}))
    guess_s = guessed.forward(build_stacks(scenario).target, [uniform_group(DECODE, 1, 1, 1000)], [0.0] * len(PHASES))
    # Two all-reduces a layer, 32 layers: the difference is the table's time over the guess's.
    ring = ALLREDUCE_LATENCY_S + 2 * 7 / 8 * message / (scenario.hardware_spec.interconnect_gb_s * 1e9)
    assert measured - guess_s == pytest.approx(64 * (table(8, message) - ring), rel=1e-9)
    assert cost.origins()["all_reduce"].startswith("published: calibration/published/nccl-a100-dgx")
    assert not cost.warnings


@pytest.mark.parametrize("over,why", [
    ({"engine": "vllm"}, "no published vllm-custom table of nvlink3 (engine vllm)"),
    ({"hardware": "mi300x", "model": "llama-2-70b"}, "no published nccl table of infinity-fabric"),
    ({"tensor_parallel": 16, "model": "llama-2-70b"}, "measured [2, 4, 8] GPUs, the scenario runs 16"),
])
def test_where_no_table_fits_the_guess_prices_the_all_reduce_and_the_result_says_so(over, why):
    scenario = tp_scenario(**over)
    cost = cost_model_for(scenario)
    assert any(why in w for w in cost.warnings), cost.warnings
    assert cost.origins()["all_reduce"].startswith("roofline guess")


def test_one_gpu_needs_no_collective_and_warns_of_none():
    cost = cost_model_for(tp_scenario(tensor_parallel=1))
    assert not cost.warnings and "all_reduce" not in cost.origins()


def test_an_engine_collectives_library_outside_the_known_ones_is_bad_input():
    from sim.errors import InputError

    with pytest.raises(InputError, match="engine.collectives: must be one of nccl, rccl, vllm-custom"):
        tp_scenario(engine={"preset": "gpt-fast", "collectives": "mpi"})


def test_the_run_json_names_the_all_reduce_origin(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": "gpt-fast",
                                "tensor_parallel": 4, "workload": {"requests": 8, "concurrency": 4},
                                "speculation": {"method": "ngram", "acceptance": {"rate": 0.6}}}))
    proc = subprocess.run([sys.executable, "-m", "sim", "run", str(path), "--json"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    origins = json.loads(proc.stdout)["provenance"]["cost_origins"]
    assert "nccl-h100-dgx" in origins["all_reduce"]


def test_profiler_inspect_prints_a_published_profiles_source_and_check():
    proc = subprocess.run([sys.executable, "-m", "profiler", "inspect", "calibration/published/nccl-a100-dgx"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Vidur (https://github.com/microsoft/vidur" in proc.stdout and "MIT" in proc.stdout
    assert "all_reduce" in proc.stdout and "held-out median" in proc.stdout


KERNELS = "calibration/published/vidur-a100-llama-2-7b"
VIDUR_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def vidur_mlp(path, bad_tokens=False):
    """An mlp.csv in Vidur's columns for a small shape: every op a line in tokens, TP 1 and 2."""
    rows = []
    for tp in (1, 2):
        for tokens in range(1, 301, 3):
            row = {"n_head": 8, "n_kv_head": 8, "n_embd": 512, "n_expanded_embd": 1376, "vocab_size": 32000,
                   "use_gated_mlp": True, "num_tokens": -1 if bad_tokens and tokens == 4 else tokens,
                   "num_tensor_parallel_workers": tp}
            for i, op in enumerate(VIDUR_OPS):
                row[f"time_stats.{op}.median"] = (0.005 + 0.0001 * (i + 1) * tokens) / tp
            rows.append(row)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_an_imported_kernel_table_names_the_calibrations_operators_and_holds_out_its_fifths(tmp_path):
    out = tmp_path / "kernels"
    proc = subprocess.run([sys.executable, "-m", "sim", "import-profile", "vidur-mlp", str(vidur_mlp(tmp_path / "m.csv")),
                           "--out", str(out), *SOURCE[:-2]], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    profile = load_published(out)
    assert profile.kind == "kernels" and profile.meta["model"]["hidden"] == 512
    assert set(profile.tables) == {"linear.qkv", "linear.o", "linear.gate_up", "linear.down", "elementwise"}
    # elementwise: the two norms, RoPE, the activation and two adds (Vidur times one add).
    parts = [VIDUR_OPS.index(op) + 1 for op in ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act",
                                                 "add", "add")]
    assert profile.table("elementwise")(2, 100) == pytest.approx(sum(0.005 + 0.0001 * i * 100 for i in parts) / 2e3,
                                                                 rel=1e-9)
    assert all(h["median_abs_error"] < 0.01 for h in profile.meta["held_out"].values())
    proc = subprocess.run([sys.executable, "-m", "sim", "import-profile", "vidur-mlp",
                           str(vidur_mlp(tmp_path / "bad.csv", bad_tokens=True)), "--out", str(tmp_path / "x"),
                           *SOURCE[:-2]], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "num_tokens must be a positive number" in proc.stderr


def test_a_scenario_of_the_tables_shape_prices_its_layers_from_them_and_the_rest_by_the_roofline():
    kernels = tp_scenario(calibration=KERNELS, speculation={"method": "draft_model", "acceptance": {"rate": 0.6},
                                                           "draft": {"model": "tinyllama-1.1b"}})
    plain = tp_scenario(speculation={"method": "draft_model", "acceptance": {"rate": 0.6},
                                     "draft": {"model": "tinyllama-1.1b"}})
    profile = load_published(REPO / KERNELS)
    stacks = build_stacks(kernels)
    measured, roofline = cost_model_for(kernels), cost_model_for(plain)
    tokens = 32
    group = [uniform_group(DECODE, tokens, 1, tokens * 1000)]
    c_measured, c_roofline = measured.pricer(stacks.target).c, roofline.pricer(stacks.target).c
    per_layer = sum(profile.table(op)(8, tokens) for op in ("linear.qkv", "linear.o", "linear.gate_up", "linear.down"))
    assert c_measured.layers_time_s(tokens) == pytest.approx(32 * per_layer, rel=1e-12)
    difference = (c_measured.layers_time_s(tokens) - c_roofline.layers_time_s(tokens)
                  + 32 * (c_measured.elementwise_s(tokens) - c_roofline.elementwise_s(tokens)))
    got = measured.forward(stacks.target, group, [0.0] * len(PHASES)) - \
        roofline.forward(stacks.target, group, [0.0] * len(PHASES))
    assert got == pytest.approx(difference, rel=1e-9)
    # The draft (another shape) keeps the roofline; the origins say which is which.
    measured.forward(stacks.draft, group, [0.0] * len(PHASES))
    origins = measured.origins()
    assert origins["target"].startswith(f"published kernels {KERNELS}") and origins["tinyllama-1.1b"] == "roofline"


@pytest.mark.parametrize("over,message", [
    ({"model": "llama-3.1-8b"}, "timed layers of hidden 4096, 32/32 heads, FFN 11008; llama-3.1-8b is another shape"),
    ({"tensor_parallel": 16, "model": "llama-2-70b", "calibration": "calibration/published/vidur-a100-llama-2-70b"},
     "timed tensor_parallel [1, 2, 4, 8], the scenario runs 16"),
    ({"dtype": "fp8"}, "timed fp16 weights; the scenario runs fp8"),
    ({"calibration": "calibration/published/nccl-a100-dgx"}, "is a published collectives table"),
])
def test_a_kernel_table_that_cannot_price_the_scenario_is_one_line(over, message):
    from sim.errors import InputError

    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tp_scenario(**{"calibration": KERNELS, **over})


def test_a_kernel_table_of_other_hardware_warns():
    cost = cost_model_for(tp_scenario(calibration=KERNELS, hardware="h100-sxm"))
    assert any("measured on a100-80g, the scenario's hardware is h100-sxm" in w for w in cost.warnings)


def test_an_engines_own_all_reduce_is_priced_by_its_own_published_table():
    """SGLang on 8 H100s reduces with its own kernel: the pull request's table, not NCCL's."""
    scenario = tp_scenario(hardware="h100-sxm", engine="sglang")
    cost = cost_model_for(scenario)
    table = load_published(PUBLISHED / "sglang-custom-h100").table("all_reduce")
    assert cost.collectives.all_reduce_s(16384, 8) == table(8, 16384)
    assert "sglang-custom-h100" in cost.origins()["all_reduce"] and not cost.warnings
    # Measured at 2 to 8 GPUs with no more than 4 MB: a larger message scales linearly past it.
    assert table(8, 8 * 4194304) == pytest.approx(8 * table(8, 4194304))
