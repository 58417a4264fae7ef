"""An EAGLE-style draft head for a Llama-family target, and its file format.

The head reads, at sequence index i, the target's last hidden state f_i (the last decoder layer's
output, before the final norm) and the embedding of the next token t_(i+1), fused by one linear
layer (2H -> H), then runs one decoder layer of the target's shape; its output estimates f_(i+1),
which the target's own final norm and LM head turn into a draft of t_(i+2) (EAGLE, Li et al. 2024).
A chain drafts by feeding its own estimate back: index i + 1 reads (estimated f_(i+1), its draft).

Training (profiler/eagle/train.py) runs the whole sequence at once, causally, with no KV cache
(`forward_sequence`); the head's weights are those of a `profiler.engine.model.Block`, so a live
drafter can run the same layer with a cache.

Two layouts (head.json's `layout`):
  standardized  this project's: the head reads the target's states standardized per dimension (fc
                with a bias), its layer is a whole decoder layer, and its estimates go through the
                target's own final norm before the LM head.
  eagle1        EAGLE-1's, as vLLM reads it (`--speculative-config '{"method": "eagle", ...}'`):
                the head reads the target's states after its final norm (what vLLM hands a drafter),
                fc has no bias, the layer has no input norm, and the LM head reads its output as is.
                `python -m profiler export-hf --head DIR` writes such a head as vLLM's folder.
In either, the head works in its own feature space (`features`): its estimates live there and are
fed back there.

On disk a head is a folder: head.safetensors (fc, the layer's weights and the feature standardization, fp32)
and head.json (the layout, the target's shape and the training's provenance).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from profiler.engine.model import Block, Llama, LlamaConfig, apply_rope, fp32_logits, rope_table

WEIGHTS, META = "head.safetensors", "head.json"


LAYOUTS = ("standardized", "eagle1")


class EagleHead(nn.Module):
    """A standardized head works on standardized hidden states: a small target's last hidden state
    has a few dimensions hundreds of times wider than the rest (SmolLM2-135M: per-dimension spread
    22 in the median, up to 400), which would swamp the regression. feature_mean and feature_std,
    measured on the training data, map the target's states in and the head's estimates back out;
    an eagle1 head's forward does not use them (its training loss does)."""

    def __init__(self, config: LlamaConfig, layout: str = "standardized"):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"unknown head layout {layout!r} (one of {', '.join(LAYOUTS)})")
        self.config = config
        self.layout = layout
        self.fc = nn.Linear(2 * config.hidden, config.hidden, bias=layout == "standardized")
        self.layer = Block(config)
        if layout == "eagle1":
            self.layer.attention_norm = nn.Identity()     # EAGLE-1 drops its layer's input norm
        self.register_buffer("feature_mean", torch.zeros(config.hidden))
        self.register_buffer("feature_std", torch.ones(config.hidden))

    def features(self, target_hidden: Tensor, target: Llama) -> Tensor:
        """The head's features [.., H] of the target's last hidden states [.., H] (before its final
        norm): those states themselves, or (eagle1) after the target's final norm."""
        return target_hidden if self.layout == "standardized" else target.norm(target_hidden)

    def standardize(self, features: Tensor) -> Tensor:
        return (features - self.feature_mean) / self.feature_std

    def fuse(self, features: Tensor, next_tokens: Tensor, target: Llama) -> Tensor:
        """[B, T, H]: the layer's input from features [B, T, H] (the target's or the head's own
        estimates) and the next tokens [B, T] (embedded by the target's own table)."""
        if self.layout == "standardized":
            features = self.standardize(features)
        return self.fc(torch.cat([target.embed(next_tokens).to(features.dtype), features], dim=-1))

    def estimate(self, y: Tensor) -> Tensor:
        """The layer's output [.., H] as an estimate of the next feature."""
        return y * self.feature_std + self.feature_mean if self.layout == "standardized" else y

    def logits(self, features: Tensor, target: Llama) -> Tensor:
        """The target's LM head on features [.., H] (after its final norm, for a standardized
        head): [.., vocab] fp32."""
        if self.layout == "standardized":
            features = target.norm(features)
        return fp32_logits(features, target.lm_head.weight)

    def forward_sequence(self, features: Tensor, next_tokens: Tensor, target: Llama) -> Tensor:
        """Estimates of feature i + 1 at every index i of whole sequences, causally, without a cache:
        [B, T, H] from features [B, T, H] and next_tokens [B, T] (index i at position i)."""
        x = self.fuse(features, next_tokens, target)
        B, T, _ = x.shape
        positions = torch.arange(T, device=x.device)
        rotation = rotations(target, positions)[None, :, None]
        return self.estimate(x + self.attend_and_feed(x, rotation))

    def attend_and_feed(self, x: Tensor, rotation: Tensor) -> Tensor:
        """The layer's residual update of x [B, T, H], causal over T, in plain torch (differentiable)."""
        q, k, v = self.project(x, rotation)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.feed(x, out)

    def project(self, x: Tensor, rotation: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The layer's rotated queries [B, Hq, T, D], keys and values [B, Hkv, T, D] of x [B, T, H]
        (rotation [B or 1, T, 1, D/2])."""
        block, a = self.layer, self.layer.attention
        B, T, _ = x.shape
        qkv = a.wqkv(block.attention_norm(x)).view(B, T, a.heads + 2 * a.kv_heads, a.head_dim)
        qk = apply_rope(qkv[:, :, :a.heads + a.kv_heads], rotation).transpose(1, 2)
        q, k = qk.split([a.heads, a.kv_heads], dim=1)
        return q, k, qkv[:, :, a.heads + a.kv_heads:].transpose(1, 2)

    def feed(self, x: Tensor, attended: Tensor) -> Tensor:
        """The layer's residual update of x [B, T, H] given its attention's output [B, Hq, T, D]."""
        block, a = self.layer, self.layer.attention
        B, T, _ = x.shape
        update = a.wo(attended.transpose(1, 2).reshape(B, T, a.heads * a.head_dim))
        return update + block.feed_forward(block.ffn_norm(x + update))


def rotations(target: Llama, positions: Tensor) -> Tensor:
    """The target's RoPE rotations at these positions (its table built if no cache set it up yet)."""
    if target.rope.numel() == 0:
        target.rope = rope_table(target.config, target.lm_head.weight.device)
    return target.rope[positions]


def save_head(head: EagleHead, folder: Path, meta: dict) -> None:
    """Write head.safetensors and head.json into folder (each through a temporary file)."""
    from safetensors.torch import save_file

    from sim.formats.files import write_file_atomic

    folder.mkdir(parents=True, exist_ok=True)
    state = {name: value.detach().float().contiguous() for name, value in head.state_dict().items()}
    write_file_atomic(folder / WEIGHTS, lambda path: save_file(state, str(path), metadata={"format": "pt"}))
    write_file_atomic(folder / META, lambda path: path.write_text(json.dumps(meta, indent=2) + "\n"))


def load_head(folder: Path, target: Llama) -> tuple[EagleHead, dict]:
    """The head in folder, for this target (its shape must match the one it was trained for)."""
    from safetensors.torch import load_file

    from sim.errors import InputError

    if not (folder / WEIGHTS).is_file() or not (folder / META).is_file():
        raise InputError("--head", f"{folder} is not a head folder (no {WEIGHTS} and {META}; write one with "
                                   f"python -m profiler train-eagle)")
    meta = json.loads((folder / META).read_text())
    shape = target_shape(target.config)
    if meta.get("target_shape") != shape:
        raise InputError("--head", f"{folder} was trained for a target of shape {meta.get('target_shape')}, "
                                   f"not this one's {shape}")
    head = EagleHead(target.config, meta.get("layout", "standardized"))
    head.load_state_dict(load_file(str(folder / WEIGHTS)))
    weight = target.lm_head.weight
    return head.to(device=weight.device, dtype=weight.dtype).eval(), meta


def target_shape(config: LlamaConfig) -> dict:
    return {name: getattr(config, name) for name in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")}
