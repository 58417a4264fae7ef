"""A byte-level BPE tokenizer rebuilt from GGUF metadata with the `tokenizers` library.

GGUF keeps the vocabulary, merges, token types and chat template; control tokens
(<|im_start|>, <|im_end|>, ...) become special tokens so each encodes to one id. The SmolLM2
pre-tokenizer splits digits one by one before the GPT-2 byte-level split, as its tokenizer.json does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONTROL_TOKEN = 3   # llama.cpp token type


@dataclass
class ChatTokenizer:
    tokenizer: object        # tokenizers.Tokenizer
    chat_template: str | None
    eos_id: int
    bos_id: int | None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            return "".join(m["content"] for m in messages)
        import jinja2

        template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, user_text: str) -> list[int]:
        return self.encode(self.apply_chat_template([{"role": "user", "content": user_text}]))

    def save(self, path) -> None:
        """One JSON file: the `tokenizers` definition plus chat template and special ids."""
        import json
        from pathlib import Path

        Path(path).write_text(json.dumps({"tokenizer": json.loads(self.tokenizer.to_str()),
                                          "chat_template": self.chat_template, "eos_id": self.eos_id,
                                          "bos_id": self.bos_id}))

    @classmethod
    def load(cls, path) -> "ChatTokenizer":
        """What `save` wrote."""
        import json
        from pathlib import Path

        from tokenizers import Tokenizer

        data = json.loads(Path(path).read_text())
        return cls(Tokenizer.from_str(json.dumps(data["tokenizer"])), data["chat_template"], data["eos_id"],
                   data["bos_id"])


def tokenizer_from_gguf(reader) -> ChatTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    fields = reader.fields
    if fields["tokenizer.ggml.model"].contents() != "gpt2":
        raise ValueError(f"unsupported tokenizer {fields['tokenizer.ggml.model'].contents()!r} (byte-level BPE only)")
    tokens_field = fields["tokenizer.ggml.tokens"]
    tokens = [bytes(tokens_field.parts[i]).decode("utf-8") for i in tokens_field.data]
    merges_field = fields["tokenizer.ggml.merges"]
    merges = [tuple(bytes(merges_field.parts[i]).decode("utf-8").split(" ", 1)) for i in merges_field.data]
    types_field = fields["tokenizer.ggml.token_type"]
    types = np.array([types_field.parts[i][0] for i in types_field.data])

    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tokenizer = Tokenizer(bpe)
    pre = fields.get("tokenizer.ggml.pre")
    splitters = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre is not None and pre.contents() == "smollm":
        splitters.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splitters)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([tokens[i] for i in np.flatnonzero(types == CONTROL_TOKEN)])
    template = fields.get("tokenizer.chat_template")
    bos = fields.get("tokenizer.ggml.bos_token_id")
    return ChatTokenizer(tokenizer, template.contents() if template is not None else None,
                         int(fields["tokenizer.ggml.eos_token_id"].contents()),
                         int(bos.contents()) if bos is not None else None)
