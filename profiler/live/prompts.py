"""A live run's prompts: chat prompts from a JSONL file, or long-context prompts of an exact token
count cut from a plain text."""
from __future__ import annotations

import json
from pathlib import Path

from sim.errors import InputError

LONG_CONTEXT_ASK = "Summarize the following text in a few sentences.\n\n"


def long_context_frame(tok) -> tuple[list[int], list[int]]:
    """The token ids before and after a long-context prompt's excerpt: the chat template around the
    instruction to summarize."""
    marker = "\x00"
    before, after = tok.apply_chat_template([{"role": "user", "content": marker}]).split(marker)
    return tok.encode(before + LONG_CONTEXT_ASK), tok.encode(after)


def long_context_prompts(tok, text_path: Path, context_tokens: int, count: int, start_token: int = 0) -> list[list[int]]:
    """`count` chat prompts of exactly `context_tokens` tokens: an instruction to summarize, then
    consecutive excerpts of the text from its token `start_token` on (each request its own), inside
    the chat template. The excerpt is spliced in as token ids, so the length is exact."""
    try:
        text = text_path.read_text(errors="replace")
    except OSError as exc:
        raise InputError("--text", f"cannot read {text_path}: {exc.strerror or exc}") from None
    head, tail = long_context_frame(tok)
    room = context_tokens - len(head) - len(tail)
    if room < 16:
        raise InputError("--context", f"{context_tokens} leaves no room beside the {len(head) + len(tail)}-token "
                                         f"template")
    body = tok.encode(text)[start_token:]
    if len(body) < room * count:
        raise InputError("--text", f"{text_path} has {len(body)} tokens past token {start_token}; {count} prompts of "
                                      f"{context_tokens} need {room * count}")
    return [head + body[i * room:(i + 1) * room] + tail for i in range(count)]


def read_prompts(path: Path, limit: int | None, per_category: int | None = None) -> list[dict]:
    """The file's chat prompts (`prompt`, or the first of `turns`), each with its `category`.
    per_category: the first N of each category, taken in turns (the first of every category, then
    the second, ...), so a closed loop or a Poisson stream mixes the categories as a server's
    traffic would; limit: the first N of what is left."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise InputError("--prompts", f"cannot read {path}: {exc.strerror or exc}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise InputError("--prompts", f"{path} line {number} is not JSON") from None
        text = row.get("prompt") if isinstance(row, dict) else None
        if text is None and isinstance(row, dict) and row.get("turns"):
            text = row["turns"][0]
        if not isinstance(text, str) or not text:
            raise InputError("--prompts", f"{path} line {number} has no `prompt` or `turns`")
        rows.append({"text": text, "category": row.get("category")})
        if per_category is None and limit is not None and len(rows) == limit:
            break
    if not rows:
        raise InputError("--prompts", f"{path} has no prompts")
    if per_category is not None:
        rows = take_in_turns(rows, per_category)[:limit]
    return rows


def take_in_turns(rows: list[dict], per_category: int) -> list[dict]:
    """The first `per_category` rows of each category, the categories in turn (file order)."""
    by_category: dict = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row)
    return [group[turn] for turn in range(per_category) for group in by_category.values() if turn < len(group)]
