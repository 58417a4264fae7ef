"""Model presets: the shape of a decoder, from each model's public config.json.

Every preset names the Hugging Face repository whose config.json it copies (fields
num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim or
hidden_size / heads, intermediate_size, vocab_size, tie_word_embeddings, max_position_embeddings;
for mixtures of experts the routed and shared experts, their width and the dense first layers; for
MLA the latent ranks and head dims; for MTP the next-n layers). A scenario can also point `model:`
at a config.json of any architecture in SUPPORTED_ARCHITECTURES (`load_hf_config`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP: each token's router picks `top_k` of `routed` experts, each a
    SwiGLU of width `ffn`; `shared` experts of the same width run on every token; the first
    `dense_layers` layers keep a dense MLP of the model's `ffn` instead."""
    routed: int
    top_k: int
    ffn: int
    shared: int = 0
    dense_layers: int = 0


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek-V2/V3): K and V are one compressed latent of
    `kv_rank` values plus `rope_dim` positional values per token, shared by all heads; queries go
    through a rank-`q_rank` bottleneck (0: a plain projection). Heads score over nope_dim + rope_dim
    and return v_dim values."""
    kv_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    q_rank: int = 0


@dataclass(frozen=True, kw_only=True)
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
    experts: Experts | None = None
    latent: Latent | None = None
    mtp_layers: int = 0          # next-n prediction layers shipped with the model (DeepSeek-V3, GLM-4.5)

    @property
    def decoder_layer_params(self) -> int:
        """Parameters of an average decoder layer's linear weights (norm weights are negligible):
        attention plus the dense MLP, or router, shared and every routed expert."""
        return mean_layer_params(self, self.layers)

    @property
    def active_layer_params(self) -> int:
        """An average layer's weights one token reads (its top_k routed experts only)."""
        return mean_layer_params(self, self.layers, routed=None if self.experts is None else self.experts.top_k)

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        return self.layers * self.decoder_layer_params + self.embedding_params


# A layer's linear operators as (name, in, out), for any shape with hidden, heads, kv_heads,
# head_dim, ffn, experts and latent (a ModelSpec, or a cost stack built from one).

def attention_linears(shape) -> tuple[tuple[str, int, int], ...]:
    if shape.latent is None:
        return (("qkv", shape.hidden, (shape.heads + 2 * shape.kv_heads) * shape.head_dim),
                ("o", shape.heads * shape.head_dim, shape.hidden))
    a = shape.latent
    q_out = shape.heads * (a.nope_dim + a.rope_dim)
    q = (("q_a", shape.hidden, a.q_rank), ("q_b", a.q_rank, q_out)) if a.q_rank else (("q", shape.hidden, q_out),)
    # kv_b's up-projection is absorbed into the query and output sides in decode (DeepSeek's MLA
    # kernels): its weights are still read once per forward.
    return (*q, ("kv_a", shape.hidden, a.kv_rank + a.rope_dim),
            ("kv_b", a.kv_rank, shape.heads * (a.nope_dim + a.v_dim)), ("o", shape.heads * a.v_dim, shape.hidden))


def dense_linears(shape) -> tuple[tuple[str, int, int], ...]:
    """A dense decoder layer: attention and a SwiGLU MLP of width ffn."""
    return (*attention_linears(shape), ("gate_up", shape.hidden, 2 * shape.ffn), ("down", shape.ffn, shape.hidden))


def moe_linears(shape) -> tuple[tuple[str, int, int], ...]:
    """A mixture-of-experts layer's linears every token runs: attention, router, shared experts."""
    e = shape.experts
    shared = (("shared_gate_up", shape.hidden, 2 * e.ffn * e.shared), ("shared_down", e.ffn * e.shared, shape.hidden)) \
        if e.shared else ()
    return (*attention_linears(shape), ("router", shape.hidden, e.routed), *shared)


def mean_layer_params(shape, layers: int, routed: int | None = None) -> int:
    """Weights of an average one of `layers` decoder layers, the first experts.dense_layers of them
    dense; `routed` routed experts counted per MoE layer (default: all of them)."""
    dense = sum(i * o for _, i, o in dense_linears(shape))
    e = shape.experts
    if e is None or not layers:
        return dense
    dense_layers = min(layers, e.dense_layers)
    moe = sum(i * o for _, i, o in moe_linears(shape)) + (e.routed if routed is None else routed) * 3 * shape.hidden * e.ffn
    return round((dense_layers * dense + (layers - dense_layers) * moe) / layers)


MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    # meta-llama/Llama-2-{7,13,70}b-hf
    ModelSpec(name="llama-2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008,
              vocab=32000, tied_embeddings=False, max_context=4096),
    ModelSpec(name="llama-2-13b", layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128, ffn=13824,
              vocab=32000, tied_embeddings=False, max_context=4096),
    ModelSpec(name="llama-2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
              vocab=32000, tied_embeddings=False, max_context=4096),
    # meta-llama/Meta-Llama-3-{8,70}B
    ModelSpec(name="llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
              vocab=128256, tied_embeddings=False, max_context=8192),
    ModelSpec(name="llama-3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
              vocab=128256, tied_embeddings=False, max_context=8192),
    # meta-llama/Llama-3.1-8B
    ModelSpec(name="llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
              vocab=128256, tied_embeddings=False, max_context=131072),
    # meta-llama/Llama-3.1-70B-Instruct and Llama-3.3-70B-Instruct (the same shape)
    ModelSpec(name="llama-3.1-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
              vocab=128256, tied_embeddings=False, max_context=131072),
    ModelSpec(name="llama-3.3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672,
              vocab=128256, tied_embeddings=False, max_context=131072),
    # togethercomputer/LLaMA-2-7B-32K (Llama-2-7B with interpolated positions)
    ModelSpec(name="llama-2-7b-32k", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008,
              vocab=32000, tied_embeddings=False, max_context=32768),
    # NousResearch/Yarn-Llama-2-7b-128k
    ModelSpec(name="yarn-llama-2-7b-128k", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128,
              ffn=11008, vocab=32000, tied_embeddings=False, max_context=131072),
    # mistralai/Mixtral-8x7B-Instruct-v0.1: 8 experts, top 2, every layer
    ModelSpec(name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
              vocab=32000, tied_embeddings=False, max_context=32768,
              experts=Experts(routed=8, top_k=2, ffn=14336)),
    # Qwen/Qwen3-30B-A3B: 128 experts of width 768, top 8, no shared expert
    ModelSpec(name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144,
              vocab=151936, tied_embeddings=False, max_context=40960,
              experts=Experts(routed=128, top_k=8, ffn=768)),
    # Qwen/Qwen3-235B-A22B: 128 experts of width 1536, top 8
    ModelSpec(name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, ffn=12288,
              vocab=151936, tied_embeddings=False, max_context=40960,
              experts=Experts(routed=128, top_k=8, ffn=1536)),
    # deepseek-ai/DeepSeek-V3 (and R1): MLA (kv_lora_rank 512, rope 64, nope 128, v 128, q_lora_rank
    # 1536), 256 routed experts of width 2048, top 8, one shared, first 3 layers dense (18432), one MTP layer
    ModelSpec(name="deepseek-v3", layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=192, ffn=18432,
              vocab=129280, tied_embeddings=False, max_context=163840,
              experts=Experts(routed=256, top_k=8, ffn=2048, shared=1, dense_layers=3),
              latent=Latent(kv_rank=512, rope_dim=64, nope_dim=128, v_dim=128, q_rank=1536), mtp_layers=1),
    # zai-org/GLM-4.5-Air: GQA 96/8 heads of 128, 128 experts of width 1408, top 8, one shared,
    # first layer dense (10944), one MTP layer
    ModelSpec(name="glm-4.5-air", layers=46, hidden=4096, heads=96, kv_heads=8, head_dim=128, ffn=10944,
              vocab=151552, tied_embeddings=False, max_context=131072,
              experts=Experts(routed=128, top_k=8, ffn=1408, shared=1, dense_layers=1), mtp_layers=1),
    # zai-org/GLM-4.5: 160 experts of width 1536, top 8, one shared, first 3 layers dense (12288)
    ModelSpec(name="glm-4.5", layers=92, hidden=5120, heads=96, kv_heads=8, head_dim=128, ffn=12288,
              vocab=151552, tied_embeddings=False, max_context=131072,
              experts=Experts(routed=160, top_k=8, ffn=1536, shared=1, dense_layers=3), mtp_layers=1),
    # openai/gpt-oss-{20b,120b}: GQA 64/8 heads of 64, experts of width 2880, top 4 (the
    # alternating 128-token sliding window is not modelled: every layer reads the whole context)
    ModelSpec(name="gpt-oss-20b", layers=24, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn=2880,
              vocab=201088, tied_embeddings=False, max_context=131072,
              experts=Experts(routed=32, top_k=4, ffn=2880)),
    ModelSpec(name="gpt-oss-120b", layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn=2880,
              vocab=201088, tied_embeddings=False, max_context=131072,
              experts=Experts(routed=128, top_k=4, ffn=2880)),
    # meta-llama/Llama-3.2-1B (head_dim 64, tied embeddings)
    ModelSpec(name="llama-3.2-1b", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192,
              vocab=128256, tied_embeddings=True, max_context=131072),
    # Qwen/Qwen2.5-{1.5B,7B,14B,32B}-Instruct (Qwen2 architecture: Llama plus a QKV bias)
    ModelSpec(name="qwen2.5-1.5b", layers=28, hidden=1536, heads=12, kv_heads=2, head_dim=128, ffn=8960,
              vocab=151936, tied_embeddings=True, max_context=32768),
    ModelSpec(name="qwen2.5-7b", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944,
              vocab=152064, tied_embeddings=False, max_context=32768),
    ModelSpec(name="qwen2.5-14b", layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128, ffn=13824,
              vocab=152064, tied_embeddings=False, max_context=32768),
    ModelSpec(name="qwen2.5-32b", layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128, ffn=27648,
              vocab=152064, tied_embeddings=False, max_context=32768),
    # Qwen/Qwen3-{4B,8B,14B} (explicit head_dim 128, QK-norm)
    ModelSpec(name="qwen3-4b", layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, ffn=9728,
              vocab=151936, tied_embeddings=True, max_context=40960),
    ModelSpec(name="qwen3-8b", layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288,
              vocab=151936, tied_embeddings=False, max_context=40960),
    ModelSpec(name="qwen3-14b", layers=40, hidden=5120, heads=40, kv_heads=8, head_dim=128, ffn=17408,
              vocab=151936, tied_embeddings=False, max_context=40960),
    # lmsys/vicuna-{7b,13b,33b}-v1.3 (LLaMA-1 based)
    ModelSpec(name="vicuna-7b", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008,
              vocab=32000, tied_embeddings=False, max_context=2048),
    ModelSpec(name="vicuna-13b", layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128, ffn=13824,
              vocab=32000, tied_embeddings=False, max_context=2048),
    ModelSpec(name="vicuna-33b", layers=60, hidden=6656, heads=52, kv_heads=52, head_dim=128, ffn=17920,
              vocab=32000, tied_embeddings=False, max_context=2048),
    # codellama/CodeLlama-34b-hf (GQA 64/8, the 34B shape)
    ModelSpec(name="codellama-34b", layers=48, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=22016,
              vocab=32000, tied_embeddings=False, max_context=16384),
    # Draft models: TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T, double7/vicuna-68m,
    # turboderp/Qwama-0.5B-Instruct (Qwen2-0.5B with Llama-3's vocabulary)
    ModelSpec(name="tinyllama-1.1b", layers=22, hidden=2048, heads=32, kv_heads=4, head_dim=64, ffn=5632,
              vocab=32000, tied_embeddings=False, max_context=2048),
    ModelSpec(name="vicuna-68m", layers=2, hidden=768, heads=12, kv_heads=12, head_dim=64, ffn=3072,
              vocab=32000, tied_embeddings=False, max_context=2048),
    ModelSpec(name="qwama-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64, ffn=4864,
              vocab=128256, tied_embeddings=True, max_context=32768),
    # meta-llama/Llama-4-Scout-17B-16E-Instruct: 16 experts of width 8192, top 1, one shared expert, every layer
    ModelSpec(name="llama-4-scout-17b-16e", layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128,
              ffn=16384, vocab=202048, tied_embeddings=False, max_context=10485760,
              experts=Experts(routed=16, top_k=1, ffn=8192, shared=1)),
    # HuggingFaceTB/SmolLM2-135M-Instruct (GQA 9/3 heads, tied embeddings)
    ModelSpec(name="smollm2-135m", layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
              vocab=49152, tied_embeddings=True, max_context=8192),
]}

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                           "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                           "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeForCausalLM",
                           "GptOssForCausalLM"}


def load_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json (Llama, Qwen2/3 dense and MoE, Mistral, Mixtral, DeepSeek-V2/V3,
    GLM-4.5, gpt-oss) into a ModelSpec.

    Raises ValueError with a one-line reason when the file is not such a config.
    """
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path} as a config.json ({exc.__class__.__name__})") from None
    architectures = (config.get("architectures") or []) if isinstance(config, dict) else []
    if architectures and not set(architectures) & SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: architecture {architectures[0]} is not supported "
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
    experts = None
    routed = config.get("n_routed_experts") or config.get("num_experts") or config.get("num_local_experts")
    if routed:
        shared = config.get("n_shared_experts") or 0
        expert_ffn = positive("moe_intermediate_size", config.get("intermediate_size"))
        if config.get("shared_expert_intermediate_size"):      # Qwen2-MoE: one wider shared expert
            shared = round(config["shared_expert_intermediate_size"] / expert_ffn)
        experts = Experts(routed=positive("n_routed_experts", routed), top_k=positive("num_experts_per_tok"),
                          ffn=expert_ffn, shared=int(shared),
                          dense_layers=int(config.get("first_k_dense_replace") or 0))
    latent = None
    if config.get("kv_lora_rank"):
        latent = Latent(kv_rank=positive("kv_lora_rank"), rope_dim=positive("qk_rope_head_dim"),
                        nope_dim=positive("qk_nope_head_dim"), v_dim=positive("v_head_dim"),
                        q_rank=int(config.get("q_lora_rank") or 0))
    head_dim = positive("head_dim", hidden // heads or None)
    if latent is not None:
        head_dim = latent.nope_dim + latent.rope_dim
    return ModelSpec(
        name=Path(path).parent.name or Path(path).stem,
        layers=positive("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=positive("num_key_value_heads", heads),
        head_dim=head_dim,
        ffn=positive("intermediate_size"),
        vocab=positive("vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_context=positive("max_position_embeddings", 4096),
        experts=experts,
        latent=latent,
        mtp_layers=int(config.get("num_nextn_predict_layers") or 0),
    )


def preset_with_shape(shape: dict) -> str | None:
    """The model preset with these dimensions (layers, hidden, heads, KV heads, head dim, FFN,
    vocabulary, tied embeddings), or None."""
    keys = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "tied_embeddings")
    for name, spec in MODELS.items():
        if all(getattr(spec, k) == shape.get(k) for k in keys):
            return name
    return None
