"""python -m profiler live | campaign | positions | hf-live | serve-live | calibrate | inspect | export-hf | train-eagle (docs/live.md,
docs/architecture.md).

Every argument parser of the profiler is here, in the form both command lines share
(sim/command_line.py); each command's arguments become a typed config (LiveConfig, CampaignConfig,
CalibrateConfig) and the command is a function call. Bad input is one line on stderr and exit
code 2.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from profiler.live.config import DEFAULT_PROMPTS
from sim.command_line import CommandLine, arguments_of
from sim.formats.names import LIVE_METHODS

if TYPE_CHECKING:
    from profiler.live.config import LiveConfig


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="smollm2, a Llama-family .gguf file, a Hugging Face folder (config.json + safetensors), "
                             "or random weights of a config.json or simulator preset (timing only)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a tokenizer saved by ChatTokenizer.save (for random weights where SmolLM2's is not installed)")
    parser.add_argument("--method", choices=LIVE_METHODS, default="ngram")
    parser.add_argument("--k", type=int, default=4, help="drafted tokens per step (chain)")
    parser.add_argument("--tree", type=_tree_shape, default=None, metavar="W,D",
                        help="a static tree instead of the chain: W branches of D drafted tokens")
    parser.add_argument("--draft-model", default="smollm2", help="draft_model: the draft (same forms as --model)")
    parser.add_argument("--draft-layers", type=int, default=None,
                        help="draft_model: keep only the draft's first N layers (a smaller model from one checkpoint)")
    parser.add_argument("--head", type=Path, default=None,
                        help="eagle: the head folder (head.safetensors + head.json) python -m profiler train-eagle wrote")
    parser.add_argument("--acceptance", type=_rates, default=None, metavar="A[,A2,...]",
                        help="synthetic: the chance each draft position keeps the target's own next token, one rate "
                             "or one a position (positions past the last take the last); each in [0, 1]")
    parser.add_argument("--draft-shape", default=None,
                        help="synthetic: the draft whose forwards it runs (random weights) for their cost: head (one "
                             "decoder layer + the LM head, as EAGLE), none (no forwards, as prompt lookup) or a "
                             "model preset (a draft model with the target's vocabulary); default head")
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
    parser.add_argument("--policy", default="static",
                        help="how many tokens each step drafts: static (k every step), off_above_batch:N (none while "
                             "more than N requests run) or goodput (the k of best expected tokens per second, priced "
                             "by --calibration)")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="--policy goodput: the calibration bundle of this machine that prices each step's k")
    parser.add_argument("--batch", type=int, default=1,
                        help="requests per static batch; with --serving continuous, the requests served at once")
    parser.add_argument("--serving", choices=("static", "continuous"), default="static",
                        help="static batches, or continuous batching: requests arrive, prefill in chunks beside "
                             "the running decodes and leave the step they finish")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="continuous: a closed loop of this many clients (default: --batch)")
    parser.add_argument("--rate", type=float, default=None, help="continuous: Poisson arrivals, requests per second")
    parser.add_argument("--arrivals", type=Path, default=None,
                        help="continuous: a file of arrival times, seconds, one a line (a trace)")
    parser.add_argument("--prefill-chunk", type=int, default=512, help="continuous: prompt tokens prefilled per iteration")
    parser.add_argument("--kv-budget", type=int, default=None,
                        help="continuous: KV tokens admission may reserve, prompt + max new tokens per request "
                             "(default: --batch requests' worth)")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                        help="JSONL with `prompt` or `turns` (first turn used), optional `category`; "
                             "default: the project's own 12 prompts")
    parser.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    parser.add_argument("--per-category", type=int, default=None,
                        help="the first N prompts of each `category`, the categories in turn (then --limit)")
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
    parser.add_argument("--warmup-tokens", type=int, default=None,
                        help="an untimed pass of the first batch, this many tokens long, before the run: "
                             "Triton compiles each new kernel shape on first use (default: 8 on cuda, 0 on cpu)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model runs; on cuda each phase is synchronized before it is timed")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="on cuda, run every forward eagerly instead of replaying captured CUDA graphs of the "
                             "decode, verify and chain-draft steps (meta.json `execution` records which ran)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="weights and activations; fp32 makes greedy speculation exactly lossless")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output folder (must not exist)")


def _tree_shape(text: str):
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expects W,D with positive integers (got {text!r})")
    return int(parts[0]), int(parts[1])


def _rates(text: str) -> tuple[float, ...]:
    from profiler.live.config import parse_rates

    try:
        return parse_rates(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_campaign_arguments(parser: argparse.ArgumentParser) -> None:
    from profiler.campaign import campaign_names

    parser.add_argument("campaign", help="a campaign's name (" + ", ".join(campaign_names()) + ") or a campaign YAML file")
    parser.add_argument("--text", type=Path, default=None,
                        help="plain text the long-context prompts are cut from, e.g. a public-domain novel")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL chat prompts for the runs that take `prompts: FILE` (e.g. "
                             "../shared/data/spec_bench_questions.jsonl)")
    parser.add_argument("--out", type=Path, required=True, help="the campaign folder (resumed when it exists)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="how many times to run it (default: the campaign's `repeats`); repeat N > 1 writes "
                             "DIR/repeats/N/NAME, even repeats in reverse order")
    parser.add_argument("--only", nargs="+", default=None, metavar="RUN", help="run only these runs of the campaign")
    parser.add_argument("--probe", action="store_true",
                        help="time the machine probe before and after every run (about 7 s a run on a 2-core CPU), "
                             "so `sim validate` adds predictions at the machine's speed")


def add_positions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="live run folders, or campaign folders")
    parser.add_argument("--out", type=Path, required=True, help="the Parquet table to write")


def add_hf_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", choices=("none", "ngram"), default="ngram",
                        help="none: greedy generate(); ngram: generate(prompt_lookup_num_tokens=K)")
    parser.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--context", type=int, required=True, help="prompt tokens, built as profiler live builds them")
    parser.add_argument("--text", type=Path, required=True, help="the plain text the prompts are cut from")
    parser.add_argument("--limit", type=int, default=4, help="prompts (run one at a time: batch 1)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output folder (must not exist)")


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to time (auto: cuda when available)")
    parser.add_argument("--model", default="smollm2",
                        help="smollm2, a model preset, or a Llama-family config.json (random weights: only shapes matter)")
    parser.add_argument("--dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                        help="auto: fp32 on the CPU, bf16 on CUDA")
    parser.add_argument("--quick", action="store_true", help="a coarser grid and one round (at most 3 minutes here)")
    parser.add_argument("--out", type=Path, help="bundle folder (default calibration/<cpu|gpu name>/<model>)")
    parser.add_argument("--rounds", type=int,
                        help="timing rounds per point, the median kept (default 3, and up to 5 while another fits the "
                             "time limit; quick 1); with --engine vllm or llama.cpp, passes that each start every "
                             "server once, in turn in order and reversed, their gaps pooled (default 2; quick 1)")
    parser.add_argument("--operators", help="comma-separated subset of operators (default all)")
    parser.add_argument("--budget-s", type=float, default=None, metavar="SECONDS",
                        help="end within SECONDS with a checked bundle: the grid chosen by measured time, coarse "
                             "first (with --quick, up to --quick's grid), more rounds only while one fits "
                             "(profiler/calibrate/budget.py); not with --rounds, --refit, --pool or another --engine "
                             "than live")
    parser.add_argument("--refit", type=Path, metavar="BUNDLE",
                        help="keep BUNDLE's operator times and redo only the engine fits (after an engine change)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", choices=("live", "hf", "vllm", "llama.cpp"), default="live",
                        help="live: this project's engine, operator by operator; hf: Hugging Face transformers' "
                             "model forward as a black box (profiler/blackbox/transformers.py); vllm, llama.cpp: "
                             "the engine's server as a black box (profiler/serve/calibrate.py; vllm: --model a Hugging "
                             "Face folder, smollm2: runs/smollm2-hf; llama.cpp: a GGUF file, smollm2: its Q4_1 file)")
    parser.add_argument("--venv", type=Path, default=Path(".vllm-venv"),
                        help="--engine vllm: vLLM's virtual environment (scripts/setup-vllm-cpu.sh)")
    parser.add_argument("--server-bin", type=Path, default=Path(".llama-server/bin/llama-server"),
                        help="--engine llama.cpp: its llama-server (scripts/build-llama-server.sh)")
    parser.add_argument("--port", type=int, default=8391, help="--engine vllm | llama.cpp: the server's port on 127.0.0.1")
    parser.add_argument("--head", type=Path, default=None,
                        help="--engine vllm: an EAGLE-1 checkpoint folder (export-hf --head); its drafting is timed too")
    parser.add_argument("--pool", type=Path, nargs="+", default=None, metavar="BUNDLE",
                        help="pool these bundles of one engine's server (--engine vllm | llama.cpp) into --out: "
                             "their measured points averaged, the tables derived again (profiler/serve/pool.py); "
                             "nothing is timed")


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, help="a bundle folder written by python -m profiler calibrate")


def add_serve_live_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("vllm", "llama.cpp"), default="vllm", help="the engine whose server runs")
    parser.add_argument("--model", type=Path, required=True,
                        help="vllm: a Hugging Face model folder (python -m profiler export-hf writes SmolLM2's); "
                             "llama.cpp: a GGUF file; smollm2: runs/smollm2-hf for vllm, the package's GGUF for llama.cpp")
    parser.add_argument("--venv", type=Path, default=Path(".vllm-venv"),
                        help="vllm: its virtual environment (scripts/setup-vllm-cpu.sh)")
    parser.add_argument("--server-bin", type=Path, default=Path(".llama-server/bin/llama-server"),
                        help="llama.cpp: its llama-server (scripts/build-llama-server.sh)")
    parser.add_argument("--parallel", type=int, default=None,
                        help="llama.cpp: the server's slots (default: the largest --batch, 16 with --rate only)")
    parser.add_argument("--method", choices=("none", "ngram", "eagle"), default="ngram",
                        help="eagle: vLLM only, the EAGLE-1 checkpoint in --head")
    parser.add_argument("--head", type=Path, default=None,
                        help="eagle: an EAGLE-1 checkpoint folder (python -m profiler export-hf --head HEAD writes one)")
    parser.add_argument("--k", type=int, nargs="+", default=[4],
                        help="drafted tokens per step; several: one server (and run folders) each")
    parser.add_argument("--prompt-lookup-min", type=int, default=2,
                        help="ngram: shortest n-gram matched (llama.cpp: the n-gram looked up, --spec-ngram-simple-size-n)")
    parser.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: longest n-gram matched (vllm)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--batch", type=int, nargs="+", default=None,
                      help="closed loop: requests in flight (default 1); several: one run each on the same server")
    load.add_argument("--rate", type=float, nargs="+", default=None,
                      help="open loop: Poisson arrivals per second; several: one run each on the same server")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                        help="JSONL with `prompt` or `turns` (first turn used), optional `category`")
    parser.add_argument("--limit", type=int, nargs="+", default=None,
                        help="prompts per run, one value or one per --batch/--rate value (several runs: each takes "
                             "the next prompts, so none shares a cached prefix)")
    parser.add_argument("--context", type=int, nargs="+", default=None,
                        help="long-context mode: prompts of this many tokens; several: one run each")
    parser.add_argument("--text", type=Path, default=None, help="long-context mode: the plain text they are cut from")
    parser.add_argument("--text-start", type=int, default=0,
                        help="long-context mode: tokens of the text skipped before the first excerpt (e.g. past "
                             "what a draft head was trained on)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="every request's output length (EOS ignored)")
    parser.add_argument("--baseline", action="store_true",
                        help="also run the server without speculation: speedup (several runs: its own folders too)")
    parser.add_argument("--interleave", action="store_true",
                        help="start the servers afresh for each setting, its drafters back to back (paired runs "
                             "where the machine's speed drifts); default: each server serves every setting")
    parser.add_argument("--bracket", action="store_true",
                        help="with --baseline: run the baseline before the speculative servers and again after "
                             "(folders none-... and none-after-...); a speedup is over the two's mean, and their "
                             "difference is how far the machine moved meanwhile")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="vllm: the weights' dtype")
    parser.add_argument("--threads", type=int, default=2, help="the server's OpenMP threads")
    parser.add_argument("--max-model-len", type=int, default=2048, help="the server's context limit")
    parser.add_argument("--port", type=int, default=8391, help="the server's port on 127.0.0.1")
    parser.add_argument("--server-arg", dest="server_args", action="append", default=[], metavar="ARG",
                        help="one more argument for every server's command line, recorded with the run "
                             "(repeatable; e.g. --server-arg=--no-async-scheduling)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True,
                        help="output folder (must not exist); several runs: one folder each inside it, named "
                             "<drafter>-[c<context>-]b<batch> or ...-r<rate> (e.g. ngram-k4-c512-b8)")


def add_export_hf_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="smollm2 or a Llama-family .gguf file")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the weights' dtype in the folder")
    parser.add_argument("--head", type=Path, default=None,
                        help="an EAGLE head folder (train-eagle --layout eagle1): write it as EAGLE-1's checkpoint, "
                             "which vLLM serves, instead of the model")
    parser.add_argument("--out", type=Path, required=True, help="the model folder to write (must not exist)")


def add_train_eagle_arguments(parser: argparse.ArgumentParser) -> None:
    from profiler.eagle.train import HELD_OUT, QUICK, TrainEagleConfig

    defaults = TrainEagleConfig(out=Path("unused"))
    parser.add_argument("--out", type=Path, required=True,
                        help="the head's folder: head.safetensors, head.json; data.pt and checkpoint.pt while it "
                             "trains (run again with the same --out to resume)")
    parser.add_argument("--model", default="smollm2", help="the target (smollm2, a .gguf or a Hugging Face folder)")
    parser.add_argument("--prompts", type=Path, default=None, help="JSONL chat prompts with a category "
                        "(e.g. ../shared/data/spec_bench_questions.jsonl)")
    parser.add_argument("--text", type=Path, default=None, help="a plain text whose excerpts are prompts too")
    parser.add_argument("--layout", choices=get_args(TrainEagleConfig.model_fields["layout"].annotation),
                        default="standardized",
                        help="standardized: this project's engine's; eagle1: EAGLE-1's, which vLLM serves "
                             "(python -m profiler export-hf --head DIR writes vLLM's folder)")
    parser.add_argument("--held-out", default=",".join(HELD_OUT),
                        help="categories kept out of training and evaluated on (comma-separated)")
    for name in ("train_prompts", "eval_per_category", "text_excerpts", "excerpt_tokens", "max_new_tokens",
                 "generate_batch", "epochs", "batch_sequences", "warmup_steps", "eval_k", "checkpoint_every",
                 "seed", "threads"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    for name in ("lr", "cls_weight", "cls_share", "noise"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name))
    parser.add_argument("--hard-labels", dest="soft_labels", action="store_false",
                        help="token loss against the target's greedy token instead of its whole distribution")
    parser.add_argument("--prompt-loss", action="store_true",
                        help="the loss at the prompts' positions too (default: the target's continuations only, as EAGLE)")
    parser.add_argument("--quick", action="store_true",
                        help="a few minutes' run for tests: " + ", ".join(f"{k} {v}" for k, v in QUICK.items()))


# ---- helpers --------------------------------------------------------------------------------------

def live_settings(args: argparse.Namespace) -> LiveConfig:
    """A `profiler live` command line as the run's LiveConfig."""
    from profiler.live.config import LiveConfig

    return LiveConfig(**arguments_of(args))


def served_model(engine: str, name: str) -> Path:
    """A server's model: `smollm2` is the exported folder for vLLM, the package's GGUF for llama.cpp."""
    if name != "smollm2":
        return Path(name)
    if engine == "llama.cpp":
        from profiler.engine.gguf_loader import ModelLoadError, smollm2_path
        from sim.errors import InputError

        try:
            return smollm2_path()
        except ModelLoadError as exc:
            raise InputError("--model", str(exc)) from None
    return Path("runs/smollm2-hf")


# ---- the commands, in the order --help lists them ----------------------------------------------

CLI = CommandLine("python -m profiler", __doc__)


@CLI.command("live", add_live_arguments)
def live_command(args: argparse.Namespace) -> None:
    """real speculative decoding on a real model, every step recorded"""
    from profiler.live.run import run_live

    run_live(live_settings(args))


@CLI.command("campaign", add_campaign_arguments)
def campaign_command(args: argparse.Namespace) -> None:
    """the live runs of a validation campaign, the model loaded once"""
    from profiler.campaign import CampaignConfig, run_campaign

    run_campaign(CampaignConfig(campaign=args.campaign, out=args.out, text=args.text, prompts=args.prompts,
                                repeats=args.repeats, only=tuple(args.only) if args.only else None, probe=args.probe))


@CLI.command("positions", add_positions_arguments)
def positions_command(args: argparse.Namespace) -> int:
    """each live run's drafter's acceptance at every position of its greedy output (for the oracle bounds,
    sim oracle)"""
    from profiler.live.positions import write_positions

    return write_positions(args.runs, args.out)


@CLI.command("hf-live", add_hf_live_arguments)
def hf_live_command(args: argparse.Namespace) -> None:
    """Hugging Face transformers' own generate (prompt lookup), recorded as a live run"""
    from profiler.blackbox.transformers import run_transformers_live
    from profiler.live.config import LiveConfig

    run_transformers_live(LiveConfig(model="hf:smollm2", method=args.method, k=args.k, batch=1,
                                     context=args.context, text=args.text, limit=args.limit,
                                     max_new_tokens=args.max_new_tokens, threads=args.threads, seed=args.seed,
                                     out=args.out))


@CLI.command("calibrate", add_calibrate_arguments)
def calibrate_command(args: argparse.Namespace) -> None:
    """time the engine's operators on this device; write a bundle"""
    from sim.errors import InputError

    server = args.engine in ("vllm", "llama.cpp")
    if args.budget_s is not None and (args.pool or server):
        raise InputError("--budget-s", "applies to the live engine's operators, not to "
                                       + ("--pool" if args.pool else f"--engine {args.engine}"))
    if args.pool:
        from profiler.serve.pool import pool_bundles

        if args.out is None:
            raise InputError("--out", "give the pooled bundle's folder")
        pool_bundles(args.pool, args.out)
    elif server:
        from profiler.serve.calibrate import ServerCalibrateConfig, calibrate_server

        calibrate_server(ServerCalibrateConfig(model=served_model(args.engine, args.model), engine=args.engine,
                                               venv=args.venv, server_bin=args.server_bin,
                                               dtype="fp32" if args.dtype == "auto" else args.dtype,
                                               threads=args.threads or 2, port=args.port, quick=args.quick,
                                               rounds=args.rounds, head=args.head, seed=args.seed, out=args.out))
    else:
        from profiler.calibrate.run import CalibrateConfig, calibrate

        operators = tuple(o.strip() for o in args.operators.split(",") if o.strip()) if args.operators else None
        config = CalibrateConfig(device=args.device, model=args.model, dtype=args.dtype, quick=args.quick,
                                 out=args.out, rounds=args.rounds, operators=operators, refit=args.refit,
                                 threads=args.threads, seed=args.seed, engine=args.engine, budget_s=args.budget_s)
        if config.engine == "hf":
            from profiler.blackbox.transformers import calibrate_transformers

            calibrate_transformers(config)
        else:
            calibrate(config)


@CLI.command("inspect", add_inspect_arguments)
def inspect_command(args: argparse.Namespace) -> None:
    """achieved bandwidth and FLOP rate of a bundle's operators"""
    from profiler.calibrate.inspect import inspect_bundle

    inspect_bundle(args.bundle)


@CLI.command("serve-live", add_serve_live_arguments)
def serve_live_command(args: argparse.Namespace) -> None:
    """a real engine's server (vLLM) with and without speculation, driven by a client and recorded"""
    from profiler.serve.run import serve_settings, settings_of

    values = arguments_of(args)
    values["model"] = served_model(args.engine, str(args.model))
    serve_settings(settings_of(values))


@CLI.command("train-eagle", add_train_eagle_arguments)
def train_eagle_command(args: argparse.Namespace) -> int:
    """train an EAGLE-style draft head for the target on its own greedy continuations"""
    from profiler.eagle.train import QUICK, TrainEagleConfig, train_eagle

    values = arguments_of(args, "quick", "held_out")
    if args.quick:
        values.update(QUICK)
    values["held_out"] = tuple(c.strip() for c in args.held_out.split(",") if c.strip())
    return train_eagle(TrainEagleConfig(**values))


@CLI.command("export-hf", add_export_hf_arguments)
def export_hf_command(args: argparse.Namespace) -> None:
    """a GGUF model as a Hugging Face folder (safetensors, config, tokenizer, chat template) for engines
    that read only that"""
    from profiler.engine.export_hf import ExportConfig, export_hf

    export_hf(ExportConfig(out=args.out, model=args.model, dtype=args.dtype, head=args.head))


def main(argv: list[str] | None = None) -> int:
    return CLI.main(argv)
