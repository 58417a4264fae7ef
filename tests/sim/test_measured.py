"""GPU steps priced from aiconfigurator-core's measured operator tables (sim/cost/measured.py): the
interpolation in log space, the tables' grids, each term's origin, the verify shape, the choice
between the tables and the roofline, and a table with missing columns as bad input."""
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from sim.cost.log_grid import LogGrid
from sim.cost.measured import MeasuredPricer
from sim.cost.measured_tables import operator_tables, read_table
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.errors import InputError
from sim.scenario import load_scenario, read_mapping

EAGLE_H100 = REPO / "scenarios/eagle-h100.yaml"


def power_law_frame(exponents, holes=()):
    """latency = 1e-6 * prod(axis ** exponent) over a small grid, with some points left out."""
    axes = [np.array([1, 2, 4, 16, 64]), np.array([32, 128, 1024])][:len(exponents)]
    rows = []
    for point in np.array(np.meshgrid(*axes, indexing="ij")).reshape(len(axes), -1).T:
        if tuple(point) not in holes:
            rows.append({**{f"x{i}": v for i, v in enumerate(point)},
                         "latency_s": 1e-6 * float(np.prod(point.astype(float) ** np.array(exponents)))})
    return pd.DataFrame(rows)


@settings(max_examples=25, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(1.0, 64.0), st.floats(32.0, 1024.0))
def test_a_power_law_is_reproduced_between_and_at_the_grid_points(p0, p1, x0, x1):
    grid = LogGrid.from_frame(power_law_frame((p0, p1)), ("x0", "x1"))
    seconds, clamped = grid.lookup(x0, x1)
    assert clamped is None
    assert seconds == pytest.approx(1e-6 * x0 ** p0 * x1 ** p1, rel=1e-9)


def test_holes_are_filled_along_the_first_axis_and_points_outside_say_where_they_were_clamped():
    frame = power_law_frame((0.5, 1.0), holes={(16, 128), (64, 1024)})
    grid = LogGrid.from_frame(frame, ("x0", "x1"), fill_first="x1")
    assert grid(16, 128) == pytest.approx(1e-6 * 16 ** 0.5 * 128, rel=1e-9)
    assert grid(64, 1024) == pytest.approx(1e-6 * 64 ** 0.5 * 1024, rel=1e-9)   # beyond its line's end: the slope
    seconds, clamped = grid.lookup(256, 64)
    assert clamped == (64, 64) and seconds == pytest.approx(1e-6 * 64 ** 0.5 * 64, rel=1e-9)


def test_the_grids_hold_the_measured_rows():
    tables = operator_tables("h100_sxm", "vllm")
    gemm = tables.frame("gemm_perf")
    row = gemm[(gemm.gemm_dtype == "bfloat16") & (gemm.m == 16) & (gemm.n == 6144) & (gemm.k == 4096)]
    assert tables.gemm("bfloat16")(4096, 16, 6144) == pytest.approx(row.latency_s.mean())
    attention = tables.attention("generation_attention_perf", 32, 8, 128, "bfloat16")
    assert attention.exact
    frame = tables.chosen("generation_attention_perf", num_heads=32, num_key_value_heads=8, head_dim=128,
                          kv_cache_dtype="bfloat16", window_size=0)
    row = frame[(frame.batch_size == 64) & (frame.step == 4095)]
    assert attention.grid(64, 4096) == pytest.approx(row.latency_s.mean())
    # A head count the table lacks: the nearest measured one, not exact.
    nearest = tables.attention("generation_attention_perf", 28, 4, 128, "bfloat16")     # Qwen2.5-7B's
    assert not nearest.exact and (nearest.heads, nearest.kv_heads) in ((24, 4), (32, 4))
    assert tables.moe("bfloat16", 2048, 768, 8, 128, 1, 1) is not None          # Qwen3-30B-A3B's experts
    assert tables.moe("bfloat16", 2048, 777, 8, 128, 1, 1) is None               # a shape nobody measured


def pricer_of(path=EAGLE_H100, **changes) -> tuple[MeasuredPricer, object]:
    mapping = read_mapping(path) | changes
    scenario = load_scenario(mapping)
    cost = cost_model_for(scenario)
    return cost.pricer(build_stacks(scenario).target), cost


def test_verification_is_the_generation_row_at_the_same_kv_plus_the_rooflines_extra_queries():
    pricer, _ = pricer_of()
    grid = pricer.generation.grid
    r = pricer.c.request_attention_s
    for requests, kv in ((1, 1000), (16, 4000), (64, 700)):
        decode = pricer.attention_s(requests, 1, kv)
        assert decode == pytest.approx(grid(requests, kv))
        for query in (2, 4, 8):
            verify = pricer.attention_s(requests, query, kv)
            assert verify == pytest.approx(grid(requests, kv) + requests * (r(query, kv) - r(1, kv)))
            assert 1.0 < verify / decode < 1.1      # memory-bound: k + 1 queries read the same KV


def test_a_short_partial_cache_stays_cheaper_than_the_full_one():
    # The kernel's floor is not scaled by the query tokens: 20 queries over SpecPV's 244 tokens of
    # partial KV cost less than over 2,019 (hypothesis found the multiplicative rule's inversion).
    pricer, _ = pricer_of()
    assert pricer.attention_s(1, 20, 244) < pricer.attention_s(1, 20, 2019)


def test_a_prompt_is_the_context_row_and_a_chunk_after_a_prefix_adds_the_rooflines_difference():
    pricer, _ = pricer_of()
    grid = pricer.context.grid
    assert pricer.attention_s(2, 1024, 1024) == pytest.approx(grid(2, 1024))
    chunk = pricer.attention_s(1, 1024, 4096)
    r = pricer.c.request_attention_s
    assert chunk == pytest.approx(grid(1, 1024) + r(1024, 4096) - r(1024, 1024))
    assert pricer.terms.counts["attention"]["extrapolated"] >= 1


def test_sim_run_json_lists_each_terms_origin_and_the_tables_provenance(tmp_path):
    from sim.cli import main

    out = tmp_path / "result.json"
    assert main(["run", str(EAGLE_H100), "--out", str(out)]) == 0
    provenance = json.loads(out.read_text())["provenance"]
    assert provenance["cost_model"] == "measured:h100_sxm/vllm/0.24.0"
    origins = provenance["cost_origins"]
    terms = origins["terms"]["target"]
    assert set(terms) >= {"linears", "attention", "lm_head", "elementwise"}
    assert set(terms["linears"]) == {"measured"}
    assert set(terms["elementwise"]) == {"roofline"}
    assert set(terms["lm_head"]) == {"extrapolated"}            # 128,256 columns, beyond the tables' 65,536
    tables = origins["operator_tables"]
    assert tables["package"] == {"package": "aiconfigurator-core", "version": "0.12.0", "licence": "Apache-2.0"}
    assert tables["tables"]["gemm_perf"]["device"] == "NVIDIA H100 80GB HBM3"
    assert provenance["warnings"] == []


def test_cost_roofline_and_gpus_the_tables_lack_keep_the_roofline_with_one_line_saying_why():
    _, forced = pricer_of(cost="roofline")
    assert forced.pricer(build_stacks(forced.scenario).target).origin == "roofline" and forced.warnings == []
    _, other = pricer_of(hardware="rtx-3090", model="llama-3.2-1b")
    assert other.warnings[0] == "GPU kernels priced by the roofline: the measured operator tables hold no rtx-3090"
    _, engine = pricer_of(engine="gpt-fast")
    assert engine.warnings[0].startswith("GPU kernels priced by the roofline: the measured operator tables hold "
                                         "no engine gpt-fast")


def test_tensor_parallel_reads_the_engines_measured_all_reduce_and_a_named_version():
    pricer, cost = pricer_of(model="llama-3.1-70b", tensor_parallel=4, engine={"preset": "sglang", "version": "0.5.6.post2"})
    assert cost.operator_tables.version == "0.5.6.post2"
    assert cost.collectives.origin.endswith("custom all-reduce")
    pricer.batch_terms_s(64, 64)
    assert pricer.terms.counts["all_reduce"] == {"measured": 1}
    message = 64 * 8192 * 2
    assert cost.collectives.all_reduce_s(message, 4) == pytest.approx(cost.operator_tables.all_reduce(4)(message))


def test_a_table_missing_a_column_is_one_line_of_bad_input(tmp_path):
    frame = pd.DataFrame({"framework": ["VLLM"], "version": ["0.24.0"], "device": ["x"], "kernel_source": ["k"],
                          "gemm_dtype": ["bfloat16"], "m": [1], "k": [64], "latency": [0.01]})
    path = tmp_path / "gemm_perf.parquet"
    frame.to_parquet(path)
    with pytest.raises(InputError, match=r"operator table .*gemm_perf.parquet: missing column n$"):
        read_table(path, "gemm_perf")


def test_sweep_cost_sets_every_point_without_a_calibration_and_gives_it_its_own_id():
    from sim.sweep.commands import with_cost
    from sim.sweep.study import expand_points, load_study

    points = expand_points(load_study("smoke"))
    forced = with_cost(points, "roofline")
    assert [p.scenario["cost"] for p in forced] == ["roofline"] * len(points)
    assert not {p.id for p in points} & {p.id for p in forced}
    assert all("cost" not in p.scenario for p in points)        # the study's own points untouched


def test_a_sweeps_rows_and_provenance_say_what_priced_each_point():
    import pandas as pd

    from sim.sweep.commands import cost_models

    frame = pd.DataFrame({"cost_model": ["measured:h100_sxm/vllm/0.24.0"] * 3 + ["roofline"]})
    counts = cost_models(frame)
    assert counts["measured:h100_sxm/vllm/0.24.0"] == 3 and counts["roofline"] == 1
    assert counts["operator_tables"]["package"] == "aiconfigurator-core"
    assert "operator_tables" not in cost_models(frame.iloc[3:])


def test_the_tables_check_scores_held_out_points_inside_the_rest_and_docs_needs_check(tmp_path):
    from sim.cli import main
    from sim.cost.table_check import held_out_table

    frame = pd.DataFrame({"kernel_source": "k", "m": 2.0 ** np.arange(20)})
    frame["latency_s"] = 1e-6 * frame.m ** 0.7
    errors = held_out_table(frame, ("kernel_source",), ("m",), "m")
    # Every fifth of 20 held out; the last, the largest m, lies beyond the rest and is not scored.
    assert len(errors) == 3 and errors.max() < 1e-9
    docs = tmp_path / "doc.md"
    docs.write_text("x\n")
    assert main(["tables", "--docs", str(docs)]) == 2
    assert docs.read_text() == "x\n"
