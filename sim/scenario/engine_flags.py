"""A parallel layout as SGLang's and vLLM's launch flags spell it, both ways.

In: a scenario's `engine_flags` (the server's command line, pasted; flags that do not set the
layout are ignored) sets `tensor_parallel`, `data_parallel`, `expert_parallel`,
`redundant_experts` and the engine's `two_batch_overlap`:

    SGLang  --tp N (all GPUs)  --dp D --enable-dp-attention  --ep-size N  --ep-num-redundant-experts R
            --enable-two-batch-overlap
    vLLM    --tensor-parallel-size T  --data-parallel-size D  --enable-expert-parallel
            --num-redundant-experts R  --enable-dbo

Out: `launch_flags(scenario)`, the same spelling of a scenario's layout (and of its disaggregated
pools) for each engine, which `sim recommend` prints.
"""
from __future__ import annotations

import shlex

from sim.errors import InputError

FIELD = "engine_flags"
LAYOUT_FIELDS = ("tensor_parallel", "data_parallel", "expert_parallel", "redundant_experts")
SGLANG = {"--tp": "tp", "--tp-size": "tp", "--tensor-parallel-size": "tp", "--dp": "dp", "--dp-size": "dp",
          "--data-parallel-size": "dp", "--ep": "ep", "--ep-size": "ep", "--expert-parallel-size": "ep",
          "--ep-num-redundant-experts": "redundant"}
SGLANG_SWITCHES = {"--enable-dp-attention": "dp_attention", "--enable-two-batch-overlap": "overlap"}
VLLM = {"--tensor-parallel-size": "tp", "-tp": "tp", "--data-parallel-size": "dp", "-dp": "dp",
        "--num-redundant-experts": "redundant"}
# vLLM's KV transfer between disaggregated pools (its NIXL connector, both roles).
KV_CONNECTOR = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
VLLM_SWITCHES = {"--enable-expert-parallel": "ep", "-ep": "ep", "--enable-dbo": "overlap"}


def parsed_flags(flags: str, values: dict[str, str], switches: dict[str, str]) -> dict:
    """The layout's flags in `flags` (name -> int, switch -> True); anything else is skipped."""
    try:
        words = shlex.split(flags)
    except ValueError as exc:
        raise InputError(FIELD, f"cannot split the command line: {exc}") from None
    found: dict = {}
    i = 0
    while i < len(words):
        word, value = words[i], None
        if "=" in word and word.startswith("--"):
            word, value = word.split("=", 1)
        if word in switches:
            found[switches[word]] = True
        elif word in values:
            if value is None:
                i += 1
                value = words[i] if i < len(words) else ""
            if not value.isdigit() or int(value) < (0 if values[word] == "redundant" else 1):
                raise InputError(FIELD, f"{word} needs a count (got {value!r})")
            found[values[word]] = int(value)
        i += 1
    return found


def layout_from_flags(engine: str, flags: str) -> dict:
    """The scenario fields (and engine field) an engine's launch flags set."""
    if engine == "sglang":
        f = parsed_flags(flags, SGLANG, SGLANG_SWITCHES)
        gpus, ranks = f.get("tp", 1), f.get("dp", 1)
        if ranks > 1 and not f.get("dp_attention"):
            raise InputError(FIELD, "--dp without --enable-dp-attention runs independent replicas: simulate one "
                                    "at its --tp and concurrency / dp")
        if gpus % ranks:
            raise InputError(FIELD, f"--dp {ranks} does not divide --tp {gpus} (SGLang's --tp counts every GPU)")
        ep = f.get("ep", 1)
        if ep not in (1, gpus):
            raise InputError(FIELD, f"--ep-size {ep}: experts over all {gpus} GPUs or split, not a part of them")
        layout = {"tensor_parallel": gpus // ranks, "data_parallel": ranks, "expert_parallel": ep == gpus > 1,
                  "redundant_experts": f.get("redundant", 0)}
    elif engine == "vllm":
        f = parsed_flags(flags, VLLM, VLLM_SWITCHES)
        layout = {"tensor_parallel": f.get("tp", 1), "data_parallel": f.get("dp", 1),
                  "expert_parallel": bool(f.get("ep")), "redundant_experts": f.get("redundant", 0)}
    else:
        raise InputError(FIELD, f"reads SGLang's or vLLM's flags; the engine is {engine}")
    if f.get("overlap"):
        layout["two_batch_overlap"] = True
    return layout


def apply_engine_flags(mapping: dict) -> dict:
    """A scenario mapping with its `engine_flags` turned into the layout fields they set; a field
    given too, with another value, is bad input."""
    flags = mapping.get(FIELD)
    if flags is None:
        return mapping
    if not isinstance(flags, str):
        raise InputError(FIELD, f"must be the server's command line as one string (got {flags!r})")
    engine = mapping.get("engine", "vllm")
    preset = engine.get("preset", "vllm") if isinstance(engine, dict) else engine
    layout = layout_from_flags(str(preset), flags)
    overlap = layout.pop("two_batch_overlap", None)
    out = {k: v for k, v in mapping.items() if k != FIELD}
    for key, value in layout.items():
        if key in out and out[key] != value:
            raise InputError(key, f"{out[key]!r} but {FIELD} says {value!r}: give one")
        out[key] = value
    if overlap:
        out["engine"] = {**(engine if isinstance(engine, dict) else {"preset": engine}), "two_batch_overlap": True}
    return out


def launch_flags(scenario) -> dict[str, str]:
    """The scenario's layout as each engine's launch flags: {"sglang": ..., "vllm": ...}, with
    `prefill:` and `decode:` servers where the pools are disaggregated."""
    out = {"sglang": sglang_layout(scenario.tensor_parallel, scenario.data_parallel, scenario.expert_parallel,
                                   scenario.redundant_experts, scenario.engine_spec.two_batch_overlap),
           "vllm": vllm_layout(scenario.tensor_parallel, scenario.data_parallel, scenario.expert_parallel,
                               scenario.redundant_experts, scenario.engine_spec.two_batch_overlap)}
    d = scenario.disaggregation
    if d is None:
        return out
    out = {"sglang": f"decode: --disaggregation-mode decode {out['sglang']}",
           "vllm": f"decode: {out['vllm']} --kv-transfer-config '{KV_CONNECTOR}'"}
    if d.prefill != "unlimited":
        p = d.prefill
        out["sglang"] += (f"; prefill ({servers(p.instances)}): --disaggregation-mode prefill "
                          f"{sglang_layout(p.tensor_parallel, p.data_parallel, p.expert_parallel, 0, False)} "
                          f"--chunked-prefill-size {p.prefill_chunk}")
        out["vllm"] += (f"; prefill ({servers(p.instances)}): "
                        f"{vllm_layout(p.tensor_parallel, p.data_parallel, p.expert_parallel, 0, False)} "
                        f"--max-num-batched-tokens {p.prefill_chunk} --kv-transfer-config "
                        f"'{KV_CONNECTOR}'")
    return out


def sglang_layout(tp: int, dp: int, ep: bool, redundant: int, overlap: bool) -> str:
    gpus = tp * dp
    flags = [f"--tp {gpus}"]
    if dp > 1:
        flags += [f"--dp {dp}", "--enable-dp-attention"]
    if ep:
        flags += [f"--ep-size {gpus}", "--moe-a2a-backend deepep"]
    if redundant:
        flags += [f"--ep-num-redundant-experts {redundant}"]
    if overlap:
        flags += ["--enable-two-batch-overlap"]
    return " ".join(flags)


def vllm_layout(tp: int, dp: int, ep: bool, redundant: int, overlap: bool) -> str:
    flags = [f"--tensor-parallel-size {tp}"]
    if dp > 1:
        flags += [f"--data-parallel-size {dp}"]
    if ep:
        flags += ["--enable-expert-parallel"]
    if redundant:
        flags += ["--enable-eplb", f"--num-redundant-experts {redundant}"]
    if overlap:
        flags += ["--enable-dbo"]
    return " ".join(flags)


def servers(count: int) -> str:
    return f"{count} server" + ("s" if count != 1 else "")
