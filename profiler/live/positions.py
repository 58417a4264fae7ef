"""`python -m profiler positions RUN_DIR... --out FILE`: how many drafts each run's drafter would
have had accepted at every position of its greedy output, not only where its steps started.

A live run records acceptance at the positions its own steps started from. The oracle bounds
(sim/validate/oracle.py) walk the output from other positions: proposing exactly what will be
accepted, or taking the better of two drafters at each step. Greedy verification is lossless, so
the output is the target's own whatever the drafter, and a chain drafter's proposal at a root is
accepted for as long as it matches the output. So, per root position p of the output:
- prompt lookup: its proposal of `max_k` tokens from the history up to p, matched with the output;
- a model drafter (shadow, layerskip, streaming): its greedy next token at every position from one
  teacher-forced forward over prompt + output (its j-th draft at p sees the j - 1 accepted ones,
  which are the output's), the leading run of matches.
Each run's own steps, walked from its roots with their drafts, must give back the accepted counts
it recorded: the share printed per run says how many did. Prompt lookup gives back every step. A
model drafter's teacher-forced forward is an approximation: in the live engine its drafts read the
target's KV for the tokens before the step and its own for those drafted within it, where one
forward over the sequence reads its own for all of them (on the committed runs the shadow int8
draft gives back 89-95% of its steps, the int4 one about half, the streaming self-draft 48-65%).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sim.errors import InputError

MAX_K = 8           # positions are scored for chains up to this long
NOT_LOOKUP = -1     # lookup_match of a model drafter's rows


def run_prompts(meta: dict, tok) -> list[list[int]]:
    """The run's prompts as its engine encoded them, rebuilt from its recorded arguments."""
    from profiler.live.prompts import long_context_prompts, read_prompts
    from sim.formats.provenance import REPO_ROOT

    a = meta["arguments"]
    if a.get("context") is not None:
        return long_context_prompts(tok, REPO_ROOT / a["text"], int(a["context"]), int(a.get("limit") or a["batch"]))
    rows = read_prompts(REPO_ROOT / a["prompts"], a.get("limit"), a.get("per_category"))
    return [tok.encode_chat(row["text"]) for row in rows]


def leading_matches(proposal: list[int], truth: list[int]) -> int:
    n = 0
    for drafted, kept in zip(proposal, truth):
        if drafted != kept:
            break
        n += 1
    return n


def ngram_positions(sequence: list[int], first_root: int, max_k: int) -> tuple[np.ndarray, np.ndarray]:
    """[roots] accepted drafts of prompt lookup at each root first_root.. len - 2, and [roots] the
    n of the n-gram its proposal matched (0: none, the last token repeated)."""
    from profiler.engine.drafters import NgramDrafter

    drafter = NgramDrafter()
    roots = range(first_root, len(sequence) - 1)
    accepted = np.array([leading_matches(drafter.lookup(sequence[:p + 1], max_k), sequence[p + 1:p + 1 + max_k])
                         for p in roots], dtype=np.int64)
    return accepted, np.array([drafter.match_length(sequence[:p + 1]) for p in roots], dtype=np.int64)


def model_positions(next_tokens: np.ndarray, sequence: list[int], first_root: int, max_k: int) -> np.ndarray:
    """[roots] accepted drafts of a greedy chain drafter whose next token after position i is
    next_tokens[i] (teacher-forced over the sequence)."""
    hits = next_tokens[:-1] == np.asarray(sequence[1:])          # hits[i]: the draft after i is the output's
    out = []
    for p in range(first_root, len(sequence) - 1):
        run = hits[p:p + max_k]
        out.append(int(np.argmin(run)) if not run.all() else len(run))
    return np.array(out, dtype=np.int64)


def teacher_forced_next_tokens(drafter, model, sequence: list[int]) -> np.ndarray:
    """The drafter's greedy next token after every position of the sequence, in one forward."""
    import torch

    from profiler.engine.model import context_mask

    length = len(sequence)
    model.setup_cache(1, length + 1)
    drafter.prepare(model, [sequence], length + 1)
    draft = getattr(drafter, "shadow", None) or getattr(drafter, "draft", None) or model
    if draft is not model and hasattr(draft, "setup_cache") and not hasattr(drafter, "shadow"):
        draft.setup_cache(1, length + 1)
    device = model.lm_head.weight.device
    positions = torch.arange(length, device=device)[None]
    mask = context_mask(positions, positions, length, drafter.sink, drafter.window)
    with torch.inference_mode():
        logits = draft(torch.tensor([sequence], device=device), positions, mask=mask, exit_layer=drafter.exit_layer)
    return logits[0].argmax(-1).cpu().numpy()


def run_positions(run_dir: Path, models: dict) -> tuple[list[dict], float]:
    """One run's rows (request, root offset, accepted up to MAX_K) and the share of its recorded
    steps the walk gives back."""
    import pandas as pd
    import torch

    from profiler.live.config import LiveConfig
    from profiler.live.run import load_model, make_drafter

    meta = json.loads((run_dir / "meta.json").read_text())
    a = meta["arguments"]
    key = (a["model"], a["dtype"], a["seed"])
    if key not in models:
        dtype = torch.float32 if a["dtype"] == "fp32" else torch.bfloat16
        models[key] = load_model(a["model"], dtype, seed=a["seed"])
    loaded = models[key]
    # The drafter is built from the run's own settings (paths are not needed to build one).
    settings = LiveConfig(**{k: v for k, v in a.items() if k in LiveConfig.model_fields and v is not None
                             and k not in ("out", "prompts", "text", "tokenizer", "arrivals", "calibration")},
                          out=Path("unused"))
    drafter = make_drafter(settings, loaded.model, next(loaded.model.parameters()).dtype)
    prompts = run_prompts(meta, loaded.tokenizer)
    outputs = {json.loads(line)["request"]: json.loads(line)["tokens"]
               for line in (run_dir / "outputs.jsonl").read_text().splitlines()}
    requests = pd.read_parquet(run_dir / "requests.parquet")
    steps = pd.read_parquet(run_dir / "steps.parquet")
    steps = steps[steps.run == "speculative"]
    rows, agree, total = [], 0, 0
    for rid, prompt_tokens in zip(requests.request, requests.prompt_tokens):
        prompt = prompts[int(rid)]
        if len(prompt) != int(prompt_tokens):
            raise InputError("RUN_DIR", f"{run_dir}: request {rid}'s prompt rebuilt as {len(prompt)} tokens, "
                                        f"recorded {prompt_tokens} (other prompts or tokenizer)")
        sequence = prompt + outputs[int(rid)]
        first_root = len(prompt)                   # the first output token is the first step's root
        if a["method"] == "ngram":
            accepted, match = ngram_positions(sequence, first_root, MAX_K)
        else:
            next_tokens = teacher_forced_next_tokens(drafter, loaded.model, sequence)
            accepted = model_positions(next_tokens, sequence, first_root, MAX_K)
            match = np.full(len(accepted), NOT_LOOKUP)
        rows += [{"request": int(rid), "root": i, "accepted": int(x), "lookup_match": int(m)}
                 for i, (x, m) in enumerate(zip(accepted, match))]
        root = 0
        # The run's own walk: each step from its root, min(accepted, its drafts) + 1 tokens on (a
        # policy's steps draft fewer than k, or none).
        own = steps[steps.request == rid].sort_values("step")
        for got, drafted in list(zip(own.accepted.to_numpy(), own.drafted.to_numpy()))[:-1]:
            total += 1                             # (the last step may run past the output's end)
            agree += int(root < len(accepted) and min(int(accepted[root]), int(drafted)) == int(got))
            root += int(got) + 1
    return rows, (agree / total if total else 1.0)


def unsupported(arguments: dict) -> str | None:
    """Why a run has no per-position acceptance here, or None."""
    if arguments["method"] not in ("ngram", "shadow", "layerskip", "streaming"):
        return f"{arguments['method']}: prompt lookup, shadow, layerskip and streaming only"
    if arguments.get("temperature") or arguments.get("tree") or arguments.get("budget") is not None:
        return "greedy chains verified against full attention only"
    return None


def write_positions(run_dirs: list[Path], out: Path) -> int:
    """Every run's per-position acceptance as one Parquet table (run, request, root, accepted,
    lookup_match: prompt lookup's matched n-gram length, -1 for a model drafter), each run folder
    given or found in a campaign folder."""
    import pandas as pd

    from sim.formats.files import write_file_atomic
    from sim.formats.run_folder import META

    models: dict = {}
    frames = []
    for run_dir in expand(run_dirs):
        arguments = json.loads((run_dir / META).read_text())["arguments"]
        if arguments["method"] == "none":
            continue
        reason = unsupported(arguments)
        if reason is not None:
            print(f"{run_dir.name}: skipped ({reason})")
            continue
        rows, replayed = run_positions(run_dir, models)
        print(f"{run_dir.name}: {len(rows)} positions; its own steps replayed {replayed:.1%}")
        frames.append(pd.DataFrame(rows).assign(run=run_dir.name)[["run", "request", "root", "accepted", "lookup_match"]])
    if not frames:
        raise InputError("RUN_DIR", "no speculative run among the folders given")
    table = pd.concat(frames, ignore_index=True)
    write_file_atomic(out, lambda path: table.to_parquet(path, index=False))
    print(f"wrote {out}")
    return 0


def expand(paths: list[Path]) -> list[Path]:
    """Run folders: each path itself, or the runs of a campaign folder (first repeat)."""
    out = []
    for path in paths:
        if (path / "meta.json").is_file():
            out.append(path)
        elif path.is_dir():
            out += sorted(p for p in path.iterdir() if (p / "meta.json").is_file())
        else:
            raise InputError("RUN_DIR", f"{path} is not a run or campaign folder")
    return out
