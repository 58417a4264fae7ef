"""`python -m profiler train-eagle --out DIR`: train an EAGLE-style head for the loaded target.

1. Data: the target's own greedy continuations of the training prompts (chat prompts outside the
   held-out categories, and excerpts of a plain text), with its last hidden state and greedy next
   token at every position (profiler/eagle/data.py); the held-out categories' prompts continued
   the same way for the evaluation. Saved to DIR/data.pt, so a resumed run does not generate again.
2. Training (EAGLE's losses): at index i the head reads (f_i, t_(i+1)) and estimates f_(i+1);
   smooth-L1 regression to the target's f_(i+1) plus `cls_weight` x cross-entropy of the draft's
   logits (the target's final norm and LM head, frozen) against the target's next-token
   distribution, on a random `cls_share` of the positions (the LM head is most of the cost). As
   EAGLE's loss mask, only positions of the target's own continuation count (a live head drafts
   from roots there); the prompt's entries are attention context. Uniform noise on
   the input features (EAGLE's, for robustness to its own estimates). AdamW, linear warm-up then
   cosine decay. A checkpoint every `checkpoint_every` steps (DIR/checkpoint.pt): a run stopped
   anywhere resumes from its last one.
3. Evaluation: at every root of the held-out outputs, the chain of k drafts greedy verification
   would accept (profiler/eagle/evaluate.py), walked as a live run steps: mean accepted drafts and
   tokens per step, per category and per position; beside it, the same walk over as many training
   sequences, and a bigram chain of the training continuations over the held-out outputs.
The head (DIR/head.safetensors) and its provenance and evaluation (DIR/head.json) are written last.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from sim.errors import InputError

HELD_OUT = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


class TrainEagleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path
    model: str = "smollm2"
    layout: Literal["standardized", "eagle1"] = "standardized"   # the head's layout (profiler/engine/eagle_head.py): standardized | eagle1
    prompts: Path | None = None          # JSONL chat prompts with `category`
    text: Path | None = None             # a plain text whose excerpts are prompts too
    held_out: tuple[str, ...] = HELD_OUT  # categories kept out of training, evaluated on
    train_prompts: int | None = None     # the first N training chat prompts (all by default)
    eval_per_category: int = 10          # held-out prompts evaluated per category
    text_excerpts: int = 48
    excerpt_tokens: int = 256
    max_new_tokens: int = 192
    generate_batch: int = 48
    epochs: int = 5
    batch_sequences: int = 2
    lr: float = 1e-3
    warmup_steps: int = 50
    cls_weight: float = 0.1
    cls_share: float = 0.5
    noise: float = 0.1                   # uniform noise on input features, +- this
    soft_labels: bool = True             # token loss against the target's whole distribution, not its argmax
    prompt_loss: bool = False            # the loss at the prompt's positions too, not only the continuation's
    eval_k: int = 4
    checkpoint_every: int = 100
    seed: int = 0
    threads: int | None = None


QUICK = dict(train_prompts=24, eval_per_category=2, text_excerpts=4, excerpt_tokens=128, max_new_tokens=32,
             epochs=2, warmup_steps=5, checkpoint_every=10)


def train_eagle(config: TrainEagleConfig) -> int:
    import torch
    from tqdm import tqdm

    from profiler.eagle.data import build_examples, chat_prompts, text_prompts
    from profiler.engine.eagle_head import EagleHead, save_head, target_shape
    from profiler.live.run import load_model
    from sim.formats.files import write_file_atomic
    from sim.formats.provenance import git_revision, repo_relative, versions

    if config.prompts is None and config.text is None:
        raise InputError("--prompts", "give training prompts: --prompts FILE (JSONL) and/or --text FILE")
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    started = time.time()
    loaded = load_model(config.model, torch.float32, seed=config.seed)
    target, tok = loaded.model, loaded.tokenizer
    for p in target.parameters():
        p.requires_grad_(False)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)

    data_path = out / "data.pt"
    recipe = config.model_dump(mode="json", include={"model", "prompts", "text", "held_out", "train_prompts",
                                                     "eval_per_category", "text_excerpts", "excerpt_tokens",
                                                     "max_new_tokens"})
    data = torch.load(data_path, weights_only=False) if data_path.exists() else None
    if data is not None and data["recipe"] != recipe:
        raise InputError("--out", f"{out} holds data of other settings ({data_path.name}); give another --out")
    if data is None:
        train_prompts, eval_prompts = [], []
        if config.prompts is not None:
            train_prompts += chat_prompts(tok, config.prompts, set(config.held_out), config.train_prompts)
            eval_prompts = held_out_prompts(tok, config.prompts, config.held_out, config.eval_per_category)
        if config.text is not None:
            train_prompts += text_prompts(tok, config.text, config.excerpt_tokens, config.text_excerpts)
        if not train_prompts:
            raise InputError("--prompts", "no training prompt left outside the held-out categories")
        with tqdm(total=2 * (len(train_prompts) + len(eval_prompts)), desc="target continuations, then states",
                  unit="sequence") as bar:
            train = build_examples(target, tok, train_prompts, config.max_new_tokens, config.generate_batch, bar)
            held = build_examples(target, tok, eval_prompts, config.max_new_tokens, config.generate_batch, bar)
        data = {"recipe": recipe, "train": train, "eval": held, "wall_s": round(time.time() - started, 1)}
        write_file_atomic(data_path, lambda path: torch.save(data, path))
    train, held = data["train"], data["eval"]
    training_started = time.time()

    head = EagleHead(target.config, config.layout)
    # Position 0 (the attention sink's) is never a target.
    every = head.features(torch.cat([e.hidden[1:] for e in train]), target)
    head.feature_mean.copy_(every.mean(0))
    head.feature_std.copy_(every.std(0).clamp(min=1e-3))
    del every
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
    per_epoch = math.ceil(len(train) / config.batch_sequences)
    total = per_epoch * config.epochs
    schedule = lambda step: min(1.0, (step + 1) / config.warmup_steps) * 0.5 * (1 + math.cos(math.pi * step / total))  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    step, losses = 0, []
    checkpoint = out / "checkpoint.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        if state["config"] != config.model_dump(mode="json", exclude={"threads"}):
            raise InputError("--out", f"{out} holds a checkpoint of other settings; give another --out")
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, losses = state["step"], state["losses"]
        print(f"resumed from step {step} of {total}")

    def save_checkpoint():
        state = {"config": config.model_dump(mode="json", exclude={"threads"}), "head": head.state_dict(),
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step, "losses": losses}
        write_file_atomic(checkpoint, lambda path: torch.save(state, path))

    head.train()
    with tqdm(total=total, initial=step, desc="training", unit="step") as bar:
        while step < total:
            epoch, index = divmod(step, per_epoch)
            order = epoch_order(train, config.batch_sequences, np.random.default_rng([config.seed, epoch]))
            rows = [train[i] for i in order[index * config.batch_sequences:(index + 1) * config.batch_sequences]]
            loss, regression, classification = batch_loss(head, target, rows, config,
                                                          torch.Generator().manual_seed(config.seed * 100003 + step))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append((float(regression), float(classification)))
            bar.set_postfix(reg=f"{regression:.3f}", cls=f"{classification:.3f}")
            bar.update(1)
            if step % config.checkpoint_every == 0 or step == total:
                save_checkpoint()

    head.eval()
    evaluation = evaluate_head(head, target, held, config.eval_k) if held else None
    references = evaluate_references(head, target, train, held, config.eval_k, config.seed) if held else None
    last = np.asarray(losses[-per_epoch:]) if losses else np.zeros((1, 2))
    meta = {
        "layout": config.layout, "target": config.model, "target_shape": target_shape(target.config), "dtype": "fp32",
        "data": {"prompts": repo_relative(config.prompts), "text": repo_relative(config.text),
                 "held_out_categories": list(config.held_out), "train_sequences": len(train),
                 "train_tokens": int(sum(len(e.tokens) for e in train)), "eval_sequences": len(held)},
        "training": {"steps": step, "epochs": config.epochs, "batch_sequences": config.batch_sequences,
                     "lr": config.lr, "cls_weight": config.cls_weight, "cls_share": config.cls_share,
                     "noise": config.noise, "soft_labels": config.soft_labels, "prompt_loss": config.prompt_loss,
                     "final_epoch_regression_loss": float(last[:, 0].mean()),
                     "final_epoch_classification_loss": float(last[:, 1].mean())},
        "evaluation": evaluation, "references": references,
        "seed": config.seed, "git_revision": git_revision(), "versions": versions(("torch",)),
        # The data's time (model load and generation, when data.pt was made, by whichever run made it)
        # and this run's training and evaluation: a run that reused data.pt took only the second.
        "data_wall_s": data.get("wall_s"), "training_wall_s": round(time.time() - training_started, 1),
        "wall_s": round(time.time() - started, 1),
    }
    save_head(head, out, meta)
    print(format_evaluation(evaluation, config.eval_k) if evaluation else "no held-out prompts: not evaluated")
    if references:
        print(format_references(references))
    print(f"wrote {repo_relative(out)}/head.safetensors and head.json ({meta['wall_s']:.0f} s; data "
          f"{meta['data_wall_s'] if meta['data_wall_s'] is not None else '?'} s, training and evaluation "
          f"{meta['training_wall_s']:.0f} s)")
    return 0


def epoch_order(examples, batch: int, rng: np.random.Generator, pool: int = 8) -> np.ndarray:
    """A shuffled order whose consecutive batches hold sequences of similar length (less padding):
    shuffled, then sorted by length within pools of `pool` batches, the batches shuffled again."""
    order = rng.permutation(len(examples))
    size = batch * pool
    for start in range(0, len(order), size):
        chunk = order[start:start + size]
        order[start:start + size] = chunk[np.argsort([len(examples[i].tokens) for i in chunk], kind="stable")]
    batches = [order[i:i + batch] for i in range(0, len(order), batch)]
    return np.concatenate([batches[i] for i in rng.permutation(len(batches))])


def held_out_prompts(tok, path: Path, held_out: tuple[str, ...], per_category: int) -> list[tuple[list[int], str]]:
    from profiler.live.prompts import read_prompts

    rows, taken = [], {}
    for row in read_prompts(path, None):
        if row["category"] in held_out and taken.get(row["category"], 0) < per_category:
            taken[row["category"]] = taken.get(row["category"], 0) + 1
            rows.append((tok.encode_chat(row["text"]), row["category"]))
    return rows


def batch_loss(head, target, rows, config: TrainEagleConfig, generator):
    """EAGLE's loss on a batch of sequences (padded; padding masked out)."""
    import torch
    import torch.nn.functional as F

    L = max(len(e.tokens) for e in rows)
    B, H = len(rows), target.config.hidden
    hidden = torch.zeros(B, L, H)
    tokens = torch.zeros(B, L, dtype=torch.long)
    labels = torch.zeros(B, L, dtype=torch.long)
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b, e in enumerate(rows):
        n = len(e.tokens)
        hidden[b, :n], tokens[b, :n], labels[b, :n] = e.hidden, e.tokens, e.labels
        # EAGLE's loss mask: a head drafts only from roots in the target's own output, whose first
        # estimate is of f_p, p >= prompt_tokens; the prompt's entries are attention context only.
        valid[b, 0 if config.prompt_loss else e.prompt_tokens:n] = True
    hidden = head.features(hidden, target)
    noisy = hidden[:, :-1] + (torch.rand(B, L - 1, H, generator=generator) * 2 - 1) * config.noise
    estimates = head.forward_sequence(noisy, tokens[:, 1:], target)          # estimate of f_(i+1), [B, L-1, H]
    mask = valid[:, 1:]
    # In standardized units: every dimension of the hidden state counts alike.
    regression = F.smooth_l1_loss(head.standardize(estimates[mask]), head.standardize(hidden[:, 1:][mask]))
    chosen = mask & (torch.rand(mask.shape, generator=generator) < config.cls_share)
    if not chosen.any():
        chosen = mask
    logits = head.logits(estimates[chosen], target)
    if config.soft_labels:
        # EAGLE's token loss: cross-entropy against the target's own distribution at f_(i+1).
        with torch.no_grad():
            wanted = torch.softmax(head.logits(hidden[:, 1:][chosen], target), -1)
        classification = F.cross_entropy(logits, wanted)
    else:
        classification = F.cross_entropy(logits, labels[:, 1:][chosen])
    return regression + config.cls_weight * classification, regression.detach(), classification.detach()


def evaluate_head(head, target, examples, k: int) -> dict:
    from profiler.eagle.evaluate import acceptance_report, chain_accepted, walk

    steps: dict[str, list[np.ndarray]] = {}
    for e in examples:
        accepted = chain_accepted(head, target, e.tokens, e.hidden, e.prompt_tokens, k)
        steps.setdefault(e.category, []).append(walk(accepted, k))
    return {"k": k, **acceptance_report(steps, k)}


def evaluate_references(head, target, train, held, k: int, seed: int) -> dict:
    """The figures a held-out one is read against (all sequences together): the head on a sample of
    its own training sequences (as many as held out), and a bigram chain of the training
    continuations on the held-out outputs."""
    from profiler.eagle.evaluate import acceptance_report, bigram_accepted, bigram_table, walk

    chosen = np.random.default_rng([seed, 28]).choice(len(train), min(len(held), len(train)), replace=False)
    sample = [train[i] for i in sorted(chosen)]
    table = bigram_table(train)
    bigram = {"held out": [walk(bigram_accepted(table, e.tokens, e.prompt_tokens, k), k) for e in held]}
    return {"head_on_training_sample": evaluate_head(head, target, sample, k)["all"] | {"sequences": len(sample)},
            "bigram_on_held_out": acceptance_report(bigram, k)["all"]}


def format_references(references: dict) -> str:
    lines = []
    for name, s in (("the head on training sequences", references["head_on_training_sample"]),
                    ("a bigram chain, held out", references["bigram_on_held_out"])):
        rates = " ".join(f"{r:.2f}" for r in s["per_position"])
        lines.append(f"{name:32s} {s['steps']:>6} steps {s['accepted_per_step']:>7.3f} accepted/step "
                     f"{s['tokens_per_step']:>6.3f} tokens/step  {rates}")
    return "\n".join(lines)


def format_evaluation(evaluation: dict, k: int) -> str:
    lines = [f"held-out acceptance, chain of k = {k} (greedy verification; per position: P(accepted >= j | >= j - 1))",
             f"{'category':14s} {'steps':>6} {'accepted/step':>14} {'tokens/step':>12}  per position"]
    for category, s in evaluation.items():
        if category == "k":
            continue
        rates = " ".join(f"{r:.2f}" for r in s["per_position"])
        lines.append(f"{category:14s} {s['steps']:>6} {s['accepted_per_step']:>14.3f} {s['tokens_per_step']:>12.3f}  {rates}")
    return "\n".join(lines)
