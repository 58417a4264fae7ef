"""`python -m profiler inspect DIR`: what a calibration bundle measured, against the hardware spec.

One row per operator: its grid, the time range, and the best achieved memory bandwidth and FLOP
rate over its points (bytes and FLOPs it must move and compute, over the measured median), each
also as a share of the datasheet figure of the simulator's hardware preset for that device.
Then the held-out error, the timing noise it follows (how far one point's timing rounds
lie apart), a budgeted calibration's points timed against its finest grid (`--budget-s`), the
fitted engine overheads, and where a scenario priced by the bundle takes each term from.
"""
from __future__ import annotations

from pathlib import Path


def inspect_published(path: Path) -> None:
    """Print a published profile's source, what it measured, each table's reach and held-out error,
    and what the simulator prices with it."""
    from sim.formats.provenance import repo_relative
    from sim.formats.published import load_published
    from sim.scenario.presets.engines import ENGINES

    profile = load_published(path)
    meta = profile.meta
    print(f"{repo_relative(profile.path)}: published, {profile.source}")
    if profile.kind == "collectives":
        what = f"{meta['interconnect']}, {meta['library']}"
    elif profile.kind == "host":
        what = f"the host work of {meta['engine']}"
    else:
        what = (f"layers of hidden {meta['model']['hidden']}, {meta['model']['heads']}/{meta['model']['kv_heads']} "
                f"heads, FFN {meta['model']['ffn']}, {meta['dtype']}")
    print(f"{profile.kind} measured on {meta['hardware']} ({what}); imported {meta['created_utc']}, "
          f"git {meta['git_revision'][:12]}")
    for column, what in meta["measured"].items():
        print(f"  {column}: {what}")
    second = next(iter(profile.tables.values())).dims[1]
    header = f"{'table':<16} {'ranks':>10} {second:>21} {'held-out median':>16} {'P90':>7}"
    print(header)
    print("-" * len(header))
    for op, table in profile.tables.items():
        held = meta["held_out"][op]
        ranks, points = table.axes
        print(f"{op:<16} {f'{int(ranks[0])}-{int(ranks[-1])}':>10} {f'{points[0]:,.0f}-{points[-1]:,.0f}':>21} "
              f"{held['median_abs_error']:>16.1%} {held['p90_abs_error']:>7.1%}")
    if profile.kind == "collectives" and profile.table("dispatch") is not None:
        print("prices: the expert-parallel all-to-all (dispatch and combine) of scenarios whose engine names it "
              "as all_to_all (sim/cost/collectives.py)")
    elif profile.kind == "collectives":
        print("prices: the tensor-parallel all-reduce of scenarios on a GPU of this interconnect whose engine "
              f"reduces with {meta['library']} (sim/cost/collectives.py)")
    elif profile.kind == "host":
        engines = sorted(e.name for e in ENGINES.values() if e.host_profile == profile.path.name)
        print(f"prices: each step's host work of the engine presets naming it as host_profile "
              f"({', '.join(engines) or 'none yet'}; sim/cost/host.py)")
    else:
        print("prices: the layers of a scenario of this shape that names it as `calibration:` (sim/cost/kernels.py); "
              "the roofline prices attention, the LM head and what else the table lacks")


def inspect_bundle(path: Path) -> None:
    """Print the bundle's operators, rates against the datasheet, held-out error and fits."""
    import pandas as pd

    from profiler.calibrate.budget import budget_line
    from sim.formats.bundle import load_bundle
    from sim.formats.bundle import PROFILE, timing_noise_line
    from sim.formats.provenance import repo_relative
    from sim.formats.published import is_published
    from sim.scenario.presets.hardware import HARDWARE

    if is_published(path):
        inspect_published(path)
        return
    bundle = load_bundle(path)
    meta = bundle.meta
    frame = pd.read_parquet(bundle.path / PROFILE)
    hw = HARDWARE.get(meta["device"].get("hardware"))
    peak_gb_s = hw.hbm_gb_s if hw else None
    peak_tflops = hw.peak_tflops(meta["dtype"]) if hw else None
    print(f"{repo_relative(bundle.path)}: {meta['model']['name']} {meta['dtype']} on {meta['device']['name']} "
          f"({meta['cpu']['threads']} threads), torch {meta['versions']['torch']}, {meta['date']}, "
          f"git {meta['git_revision'][:12]}")
    if hw:
        print(f"datasheet ({hw.name}): {peak_gb_s:g} GB/s, {peak_tflops:g} TFLOP/s {meta['dtype']}")
    header = f"{'operator':<18} {'points':>6} {'min':>10} {'max':>10} {'best GB/s':>10} {'of spec':>8} " \
             f"{'best TFLOP/s':>12} {'of spec':>8} {'held-out':>8}"
    print(header)
    print("-" * len(header))
    per_op = meta.get("held_out", {}).get("per_operator", {})
    for op in meta["grid"]:
        rows = frame[(frame.op == op) & ~frame.held_out]
        gb_s = (rows.bytes_moved / rows.seconds).max() / 1e9
        tflops = (rows.flops / rows.seconds).max() / 1e12
        share = lambda value, peak: f"{value / peak:.0%}" if peak and value > 0 else "-"
        # A black-box bundle (`calibrate --engine hf`) times whole forwards: no bytes or FLOPs.
        rate = lambda value, spec: format(value, spec) if value == value else "-"
        err = per_op.get(op)
        print(f"{op:<18} {len(rows):>6} {_time(rows.seconds.min()):>10} {_time(rows.seconds.max()):>10} "
              f"{rate(gb_s, '.1f'):>10} {share(gb_s, peak_gb_s):>8} {rate(tflops, '.3f'):>12} "
              f"{share(tflops, peak_tflops):>8} "
              f"{f'{err:.1%}' if err is not None else '-':>8}")
    held = meta.get("held_out", {})
    if held.get("median_abs_error") is not None:
        print(f"held-out error: median {held['median_abs_error']:.1%}, P90 {held['p90_abs_error']:.1%}, worst "
              f"{held['max_abs_error']:.1%} over {held['points']} points; whole forwards: median "
              f"{held['forward_median_abs_error']:.1%}")
    if bundle.round_spread is not None:
        print(timing_noise_line(bundle.round_spread, int(bundle.meta["rounds"])))
    if budget_line(meta) is not None:
        print(budget_line(meta))
    fits = meta.get("fits", {})
    if fits:
        print(f"fitted engine host time per step: "
              f"{fits['step_overhead_s'] * 1e6:.0f} us + {fits['request_overhead_s'] * 1e6:.0f} us per request")
    print_prices(bundle)


def print_prices(bundle) -> None:
    """Where a scenario of the bundle's model and dtype, priced by it, takes each term from (the
    cost model's origins, sim/cost/model.py): the target, a one-layer EAGLE head, the int8 and int4
    shadows, and the engine's host work."""
    from sim.cost.model import calibrated_cost_model
    from sim.cost.stack import build_stacks
    from sim.errors import InputError
    from sim.scenario.load import load_scenario

    meta = bundle.meta
    base = {"hardware": meta["device"].get("hardware") or "cpu", "model": meta["model"]["name"], "dtype": meta["dtype"],
            "calibration": str(bundle.path)}
    drafters = {"target": None, "EAGLE head": {"method": "eagle"},
                "shadow int8": {"method": "shadow", "draft": {"bits": 8}},
                "shadow int4": {"method": "shadow", "draft": {"bits": 4}}}
    rate = {"acceptance": {"rate": 0.5}}          # any: only the stacks are priced here
    print("prices (a scenario of this model and dtype with this calibration):")
    try:
        for label, speculation in drafters.items():
            scenario = load_scenario({**base, **({"speculation": {**speculation, **rate}} if speculation else {})})
            cost = calibrated_cost_model(scenario, bundle)
            stacks = build_stacks(scenario)
            stack = stacks.target if speculation is None else stacks.draft
            print(f"  {label:<12} {cost.pricer(stack).origin}")
        print(f"  {'host work':<12} {cost.host.origin}")
    except InputError as exc:
        print(f"  - (no scenario of the bundle's model: {exc})")


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"
