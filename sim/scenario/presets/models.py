"""Model presets: the shape of a Llama-family decoder, from each model's public config.json.

Every preset names the Hugging Face repository whose config.json it copies (fields
num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim or
hidden_size / heads, intermediate_size, vocab_size, tie_word_embeddings, max_position_embeddings).
A scenario can also point `model:` at any config.json of this family.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied_embeddings: bool
    max_context: int

    @property
    def decoder_layer_params(self) -> int:
        """Parameters of one decoder layer's linear weights (norm weights are negligible)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.ffn
        return qkv + out + mlp

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.layers * self.decoder_layer_params + self.embedding_params


def _m(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied, max_context) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied, max_context)


MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    # meta-llama/Llama-2-{7,13,70}b-hf
    _m("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, False, 4096),
    _m("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, False, 4096),
    _m("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, False, 4096),
    # meta-llama/Meta-Llama-3-{8,70}B
    _m("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, False, 8192),
    _m("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, False, 8192),
    # meta-llama/Llama-3.1-8B
    _m("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, False, 131072),
    # meta-llama/Llama-3.2-1B (head_dim 64, tied embeddings)
    _m("llama-3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, True, 131072),
    # Qwen/Qwen2.5-{1.5B,7B,14B,32B}-Instruct (Qwen2 architecture: Llama plus a QKV bias)
    _m("qwen2.5-1.5b", 28, 1536, 12, 2, 128, 8960, 151936, True, 32768),
    _m("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, False, 32768),
    _m("qwen2.5-14b", 48, 5120, 40, 8, 128, 13824, 152064, False, 32768),
    _m("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, False, 32768),
    # Qwen/Qwen3-{4B,8B,14B} (explicit head_dim 128, QK-norm)
    _m("qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, True, 40960),
    _m("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, False, 40960),
    _m("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936, False, 40960),
    # lmsys/vicuna-{7b,13b,33b}-v1.3 (LLaMA-1 based)
    _m("vicuna-7b", 32, 4096, 32, 32, 128, 11008, 32000, False, 2048),
    _m("vicuna-13b", 40, 5120, 40, 40, 128, 13824, 32000, False, 2048),
    _m("vicuna-33b", 60, 6656, 52, 52, 128, 17920, 32000, False, 2048),
    # HuggingFaceTB/SmolLM2-135M-Instruct (GQA 9/3 heads, tied embeddings)
    _m("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, True, 8192),
]}

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"}


def load_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json of the Llama family into a ModelSpec.

    Raises ValueError with a one-line reason when the file is not such a config.
    """
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path} as a config.json ({exc.__class__.__name__})") from None
    architectures = (config.get("architectures") or []) if isinstance(config, dict) else []
    if architectures and not set(architectures) & SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: architecture {architectures[0]} is not of the Llama family "
                         f"({', '.join(sorted(SUPPORTED_ARCHITECTURES))})")
    if not isinstance(config, dict):
        raise ValueError(f"{path}: config.json must hold a mapping")

    def positive(key: str, default=None) -> int:
        value = config.get(key)
        if value is None:
            value = default
        if value is None:
            raise ValueError(f"{path}: config.json lacks {key}")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{path}: {key} must be a positive integer (got {value!r})")
        return value

    hidden = positive("hidden_size")
    heads = positive("num_attention_heads")
    return ModelSpec(
        name=Path(path).parent.name or Path(path).stem,
        layers=positive("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=positive("num_key_value_heads", heads),
        head_dim=positive("head_dim", hidden // heads or None),
        ffn=positive("intermediate_size"),
        vocab=positive("vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_context=positive("max_position_embeddings", 4096),
    )
