"""The report's recommendations as the engines' own config, per panel and context.

For a panel whose load is the closed-loop batch: the speculative method the recommendations pick
most often, its best static k at each batch (0 where the recommendation is no speculation or where
no k of it speeds the engine up), as vLLM's `--speculative-config` with
`num_speculative_tokens_per_batch_size` (ranges split between the batches tried, as `sim
recommend` writes them), and SGLang's flags per range (SGLang has no per-batch schedule). vLLM
runs one method per server: a batch where the recommendation is another method gets this method's
best k there, and the table says so.
"""
from __future__ import annotations

import html
import json
from collections import Counter

import pandas as pd

from sim.recommend import batch_schedule, sglang_flags, vllm_config
from sim.sweep.frames import context_label, eligible


def engine_configs(frame: pd.DataFrame, rec: pd.DataFrame, max_divergence: float) -> list[dict]:
    """A row per (panel, context) of a batch-loaded panel: method, schedule, vLLM and SGLang config."""
    out = []
    for panel, recs in rec.groupby("panel", sort=False):
        if recs["load_axis"].iloc[0] != "batch":
            continue
        points = eligible(frame[frame.panel == panel], max_divergence)
        scenario_method = dict(zip(points["method"], points["speculation"]))
        for context, cells in recs.groupby("context", sort=True):
            picked = [scenario_method.get(c) for c in cells["choice"].dropna()]
            speculative = [m for m in picked if m not in (None, "none")]
            row = {"panel": panel, "context": context, "method": None, "schedule": None, "vllm": None,
                   "sglang": None, "other_methods": []}
            out.append(row)
            if not speculative:
                continue
            method = Counter(speculative).most_common(1)[0][0]
            static = points[(points.speculation == method) & (points.policy.fillna("static") == "static")
                            & (points.context == context) & points.k.notna()]   # chains: a k to schedule
            batches = sorted(int(b) for b in cells["load"].dropna())
            ks = []
            for batch in batches:
                choice = cells[cells.load == batch]["choice"].iloc[0]
                best = static[static.batch == batch].sort_values("speedup").tail(1)
                off = scenario_method.get(choice) in (None, "none") or best.empty or best.speedup.iloc[0] < 1
                ks.append({"batch": batch, "best_k": 0 if off else int(best.k.iloc[0])})
                if scenario_method.get(choice) not in (None, "none", method):
                    row["other_methods"].append(f"batch {batch}: {choice}")
            schedule = batch_schedule(ks, batches, max(batches))
            row.update(method=method, schedule=schedule, vllm=vllm_config(method, schedule),
                       sglang=[(first, last, sglang_flags(method, k)) for first, last, k in schedule])
    return out


def engine_config_html(configs: list[dict]) -> str:
    """The configs as a table: per panel and context, what to paste into vLLM and SGLang."""
    if not configs:
        return "<p class='note'>No panel loads by closed-loop batch: no per-batch schedule to write.</p>"
    rows = []
    for c in configs:
        if c["method"] is None:
            vllm, sglang = "no speculation at any batch (leave --speculative-config unset)", ""
        else:
            vllm = ("no vLLM drafter for " + c["method"] if c["vllm"] is None else
                    "no speculation at any batch" if not c["vllm"] else
                    f"--speculative-config '{json.dumps(c['vllm'])}'")
            sglang = "<br>".join(f"batch {a}-{b}: {flags or '(no speculation)'}" if flags is not None
                                 else f"batch {a}-{b}: no SGLang drafter" for a, b, flags in c["sglang"])
        note = ("; elsewhere the recommendation is another method (" + ", ".join(c["other_methods"]) + ")"
                if c["other_methods"] else "")
        rows.append(f"<tr><td>{html.escape(str(c['panel']))}</td><td>{context_label(c['context'])}</td>"
                    f"<td>{html.escape(str(c['method'] or 'none'))}{html.escape(note)}</td>"
                    f"<td><code>{html.escape(vllm)}</code></td><td><small>{html.escape(sglang).replace('&lt;br&gt;', '<br>')}"
                    f"</small></td></tr>")
    return ("<table><tr><th>panel</th><th>context</th><th>method</th><th>vLLM (DRAFT_MODEL_PATH: your draft "
            "checkpoint)</th><th>SGLang, per batch range</th></tr>" + "".join(rows) + "</table>")
