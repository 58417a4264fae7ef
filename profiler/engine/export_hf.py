"""A Llama-family GGUF as a Hugging Face model folder, for engines that read only that format
(vLLM, transformers without its GGUF reader).

`python -m profiler export-hf --out DIR [--model smollm2 | FILE.gguf] [--dtype fp32|bf16]` writes

  config.json              LlamaForCausalLM with the GGUF's shape, RoPE base and norm epsilon
  model.safetensors        every weight dequantized (Q4_1 -> fp32, or bf16), Q and K rows moved
                           back from llama.cpp's interleaved rotary layout to Hugging Face's
                           half-split one
  tokenizer.json           the byte-level BPE rebuilt from the GGUF (profiler/engine/tokenizer.py)
  tokenizer_config.json    the chat template and the special tokens
  generation_config.json   BOS and EOS ids

into a temporary folder renamed to DIR when complete. The weights are the GGUF's after
dequantization, so the folder runs the same model `profiler live --model smollm2` runs.

With `--head HEAD` it writes instead that EAGLE head (`profiler train-eagle --layout eagle1`) as
EAGLE-1's checkpoint folder, which vLLM serves with `--speculative-config '{"method": "eagle",
"model": DIR, ...}'`: config.json (the target's, one layer) and model.safetensors holding fc and
layer 0 under EAGLE-1's names, with no input norm, embedding or LM head (vLLM shares the target's).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from profiler.engine.gguf_loader import GGUF_NAMES, ModelLoadError, open_gguf, read_config, smollm2_path
from profiler.engine.loaders import HF_NAMES
from profiler.engine.model import LlamaConfig
from profiler.engine.tokenizer import ChatTokenizer, tokenizer_from_gguf
from sim.errors import InputError
from sim.formats.files import write_folder_atomic

DTYPES = {"fp32": ("float32", np.float32), "bf16": ("bfloat16", None)}


@dataclass(frozen=True)
class ExportConfig:
    out: Path
    model: str = "smollm2"      # "smollm2" or a Llama-family .gguf file
    dtype: str = "fp32"         # fp32 | bf16
    head: Path | None = None    # an eagle1 head folder: write it as EAGLE-1's checkpoint instead


def unpermute_rope(weight: np.ndarray, heads: int) -> np.ndarray:
    """[heads * D, in] Q or K rows from llama.cpp's interleaved rotary layout back to Hugging Face's
    half-split one: the inverse of gguf_loader.permute_rope."""
    out_features, in_features = weight.shape
    head_dim = out_features // heads
    return (weight.reshape(heads, head_dim // 2, 2, in_features).swapaxes(1, 2)
            .reshape(out_features, in_features))


def hf_config(config: LlamaConfig, tok: ChatTokenizer, torch_dtype: str) -> dict:
    """config.json of a LlamaForCausalLM with the GGUF's shape."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": config.hidden, "intermediate_size": config.ffn,
        "num_hidden_layers": config.layers, "num_attention_heads": config.heads,
        "num_key_value_heads": config.kv_heads, "head_dim": config.head_dim, "vocab_size": config.vocab,
        "max_position_embeddings": config.max_context, "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta, "rope_scaling": None, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": config.tied_embeddings,
        "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "torch_dtype": torch_dtype,
    }


def tokenizer_config(tok: ChatTokenizer, max_context: int) -> dict:
    """tokenizer_config.json: the fast tokenizer's class, chat template and special tokens."""
    vocab = tok.tokenizer.get_vocab()
    name = {i: t for t, i in vocab.items()}
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                "add_bos_token": False, "add_eos_token": False, "eos_token": name[tok.eos_id],
                "pad_token": name[tok.eos_id], "model_max_length": max_context}
    if tok.bos_id is not None:
        settings["bos_token"] = name[tok.bos_id]
    if tok.chat_template is not None:
        settings["chat_template"] = tok.chat_template
    return settings


def hf_state(shape: LlamaConfig, weight) -> dict[str, np.ndarray]:
    """Every weight under its Hugging Face name; weight(key, layer) -> the GGUF's fp32 array for a
    GGUF_NAMES key. Q and K rows go back to the half-split rotary layout."""
    state = {HF_NAMES["embed"]: weight("embed"), HF_NAMES["norm"]: weight("norm")}
    if not shape.tied_embeddings:
        state[HF_NAMES["lm_head"]] = weight("lm_head")
    for i in range(shape.layers):
        for key in ("q", "k", "v", "o", "gate", "up", "down", "attn_norm", "ffn_norm"):
            w = weight(key, i)
            if key in ("q", "k"):
                w = unpermute_rope(w, shape.heads if key == "q" else shape.kv_heads)
            state[HF_NAMES[key].format(i=i)] = w
    return {k: np.ascontiguousarray(v) for k, v in state.items()}


def eagle_state(head: dict[str, np.ndarray], shape: LlamaConfig) -> dict[str, np.ndarray]:
    """An eagle1 head's weights (profiler.engine.eagle_head.EagleHead's state) under EAGLE-1's
    checkpoint names; Q and K rows back to the half-split rotary layout, as the target's."""
    q, k, v = np.split(head["layer.attention.wqkv.weight"],
                       [shape.heads * shape.head_dim, (shape.heads + shape.kv_heads) * shape.head_dim])
    gate, up = np.split(head["layer.feed_forward.w_gate_up.weight"], 2)
    state = {"fc.weight": head["fc.weight"],
             "layers.0.self_attn.q_proj.weight": unpermute_rope(q, shape.heads),
             "layers.0.self_attn.k_proj.weight": unpermute_rope(k, shape.kv_heads),
             "layers.0.self_attn.v_proj.weight": v, "layers.0.self_attn.o_proj.weight": head["layer.attention.wo.weight"],
             "layers.0.post_attention_layernorm.weight": head["layer.ffn_norm.weight"],
             "layers.0.mlp.gate_proj.weight": gate, "layers.0.mlp.up_proj.weight": up,
             "layers.0.mlp.down_proj.weight": head["layer.feed_forward.w_down.weight"]}
    return {name: np.ascontiguousarray(value) for name, value in state.items()}


def read_eagle1_head(folder: Path, shape: LlamaConfig) -> dict[str, np.ndarray]:
    """The weights of an eagle1 head trained for a target of this shape; InputError otherwise."""
    from safetensors.numpy import load_file

    from profiler.engine.eagle_head import META, WEIGHTS, target_shape

    if not (folder / WEIGHTS).is_file() or not (folder / META).is_file():
        raise InputError("--head", f"{folder} is not a head folder (no {WEIGHTS} and {META}; python -m profiler "
                                   f"train-eagle --layout eagle1 writes one)")
    meta = json.loads((folder / META).read_text())
    if meta.get("layout", "standardized") != "eagle1":
        raise InputError("--head", f"{folder} is a {meta.get('layout', 'standardized')} head; vLLM serves EAGLE-1's "
                                   f"layout (python -m profiler train-eagle --layout eagle1)")
    if meta.get("target_shape") != target_shape(shape):
        raise InputError("--head", f"{folder} was trained for a target of shape {meta.get('target_shape')}, "
                                   f"not this one's {target_shape(shape)}")
    return load_file(str(folder / WEIGHTS))


def export_hf(config: ExportConfig) -> Path:
    """Write the folder; returns it. Bad input raises InputError (one line)."""
    from safetensors.numpy import save_file

    if config.dtype not in DTYPES:
        raise InputError("--dtype", f"must be one of {', '.join(DTYPES)} (got {config.dtype!r})")
    if config.out.exists():
        raise InputError("--out", f"{config.out} exists; give a new folder")
    try:
        path = smollm2_path() if config.model == "smollm2" else Path(config.model)
    except ModelLoadError as exc:
        raise InputError("--model", str(exc)) from None
    if path.suffix != ".gguf" or not path.is_file():
        raise InputError("--model", f"expects smollm2 or a .gguf file (got {config.model!r})")
    try:
        reader, tensor = open_gguf(path)
        shape = read_config(reader)
        tok = tokenizer_from_gguf(reader)
        if config.head is None:
            state = hf_state(shape, lambda key, i=0: tensor(GGUF_NAMES[key].format(i=i)))
    except (ModelLoadError, ValueError, KeyError) as exc:
        raise InputError("--model", f"{path.name}: {exc}") from None
    torch_dtype, np_dtype = DTYPES[config.dtype]
    if config.head is not None:
        return write_eagle_folder(config, shape, tok, read_eagle1_head(config.head, shape))

    def fill(folder: Path) -> None:
        if np_dtype is None:       # bf16: safetensors via torch, which has the dtype
            import torch
            from safetensors.torch import save_file as save_torch

            save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in state.items()},
                       str(folder / "model.safetensors"), metadata={"format": "pt"})
        else:
            save_file({k: v.astype(np_dtype) for k, v in state.items()}, str(folder / "model.safetensors"),
                      metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(hf_config(shape, tok, torch_dtype), indent=2) + "\n")
        (folder / "tokenizer.json").write_text(tok.tokenizer.to_str())
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok, shape.max_context), indent=2) + "\n")
        generation = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id}
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")

    write_folder_atomic(config.out, fill)
    print(f"wrote {config.out}: {shape.name}, {shape.layers} layers, {len(state)} tensors ({config.dtype})")
    return config.out


def write_eagle_folder(config: ExportConfig, shape: LlamaConfig, tok: ChatTokenizer, head: dict[str, np.ndarray]) -> Path:
    """EAGLE-1's checkpoint folder of an eagle1 head: config.json (the target's, one layer) and
    model.safetensors."""
    from safetensors.numpy import save_file

    torch_dtype, np_dtype = DTYPES[config.dtype]
    if np_dtype is None:
        raise InputError("--dtype", "an EAGLE head is written in fp32 (vLLM runs it in the target's dtype)")
    state = eagle_state(head, shape)
    settings = {**hf_config(shape, tok, torch_dtype), "num_hidden_layers": 1}

    def fill(folder: Path) -> None:
        save_file({k: v.astype(np_dtype) for k, v in state.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(settings, indent=2) + "\n")

    write_folder_atomic(config.out, fill)
    print(f"wrote {config.out}: EAGLE-1 head of {config.head} for {shape.name} ({len(state)} tensors, fp32)")
    return config.out
