"""A stack: the weights one forward reads and the operators it runs.

The target model, an EAGLE head, a shadow (quantized) copy, the first layers of the target, a
separate draft model: each is a run of identical decoder layers plus an LM head, differing only in
how many layers, how many bytes per weight, and how much KV its attention reads. Stacks are built
once per scenario (`build_stacks`); the cost models price them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import EllipsisType
from typing import Any

from sim.scenario.presets import Experts, Latent, ModelSpec
from sim.scenario.presets.models import dense_linears, mean_layer_params, moe_linears
from sim.scenario.schema import Scenario


@dataclass(frozen=True, kw_only=True)
class Stack:
    """A run of identical decoder layers of `shape` (a model's width, heads, MLP, experts and
    attention kind: its own layers and vocabulary aside) and an LM head."""
    name: str
    shape: ModelSpec
    layers: int
    weight_bytes: float          # bytes per decoder-layer weight (2 for bf16, ~0.56 for int4 g64)
    lm_head_vocab: int           # 0 when the forward needs no logits of its own
    lm_head_count: int = 1       # Medusa runs one LM head per drafted position
    # (in_features, out_features) linears run once per forward outside the decoder layers
    extra_linears: tuple[tuple[int, int], ...] = ()
    attention: bool = True
    kv_window: int | None = None  # attention reads at most this many KV tokens (streaming self-draft)

    # The layers' shape, as the operators read it.
    hidden = property(lambda self: self.shape.hidden)
    heads = property(lambda self: self.shape.heads)
    kv_heads = property(lambda self: self.shape.kv_heads)
    head_dim = property(lambda self: self.shape.head_dim)
    ffn = property(lambda self: self.shape.ffn)
    experts = property(lambda self: self.shape.experts,
                       doc="a mixture of experts in every layer past experts.dense_layers")
    latent = property(lambda self: self.shape.latent, doc="multi-head latent attention instead of GQA")

    @property
    def linears(self) -> tuple[tuple[str, int, int], ...]:
        """A dense decoder layer's linear operators as (name, in, out)."""
        return dense_linears(self)

    @property
    def moe_linears(self) -> tuple[tuple[str, int, int], ...]:
        """A mixture-of-experts layer's linears every token runs: attention, router, shared experts."""
        return moe_linears(self)

    @property
    def dense_layers(self) -> int:
        return self.layers if self.experts is None else min(self.layers, self.experts.dense_layers)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    @property
    def layer_weight_params(self) -> int:
        """An average layer's weights (every routed expert counted): what residency and offloading hold."""
        return mean_layer_params(self, self.layers)

    def layer_weight_bytes(self) -> float:
        return self.layer_weight_params * self.weight_bytes

    def layer_expert_bytes(self) -> float:
        """An average layer's routed experts' weights: what expert parallelism and the MoE's split
        spread over every GPU (the rest is split by the attention rank's tensor parallelism)."""
        if self.experts is None or not self.layers:
            return 0.0
        return (self.layer_weight_params - mean_layer_params(self, self.layers, routed=0)) * self.weight_bytes


def stack_of(model: ModelSpec, name: str, weight_bytes: float, layers: int | None = None, *,
             experts: Experts | None | EllipsisType = ..., latent: Latent | None | EllipsisType = ...,
             **kw) -> Stack:
    """A stack of `model`'s layers (all of them, or the first `layers`), with other experts or
    attention where given (an EAGLE head is dense whatever its target; an MTP module's experts have
    no dense first layers)."""
    changes: dict[str, Any] = {k: v for k, v in (("experts", experts), ("latent", latent)) if v is not ...}
    return Stack(name=name, shape=replace(model, **changes) if changes else model,
                 layers=model.layers if layers is None else layers, weight_bytes=weight_bytes, **kw)


def quantized_weight_bytes(bits: int, group_size: int) -> float:
    """Bytes per weight of a weight-only quantized matrix with a 16-bit scale and zero per group."""
    return bits / 8 + 4 / group_size


@dataclass(frozen=True)
class Stacks:
    target: Stack
    draft: Stack | None          # None for ngram (host drafter) and the baseline
    # Does the draft keep a KV cache of its own (memory), and does it read the target's KV?
    draft_owns_kv: bool = False
    draft_weights_resident_bytes: float = 0.0
    draft_expert_bytes: float = 0.0     # of which routed experts (spread over every GPU)


def build_stacks(scenario: Scenario) -> Stacks:
    """The stacks one scenario runs: the target and, for model-based drafters, the draft."""
    model = scenario.model_spec
    wbytes = scenario.weight_bytes
    target = stack_of(model, "target", wbytes, lm_head_vocab=model.vocab)
    spec = scenario.speculation
    draft = spec.draft
    method = spec.method
    if method in ("none", "ngram"):
        return Stacks(target, None)
    if method in ("eagle", "eagle3", "mtp"):
        vocab = draft.vocab or (32000 if method == "eagle3" else model.vocab)
        # EAGLE fuses the token embedding with the target's last hidden state (2h -> h), EAGLE-3
        # three target hidden states (3h -> h), an MTP module the embedding and hidden state (2h -> h).
        extra = ((3 * model.hidden, model.hidden),) if method == "eagle3" else ((2 * model.hidden, model.hidden),)
        # EAGLE heads are dense Llama layers of the target's width whatever the target, kept in the
        # activation dtype (engines load them unquantized beside an FP8 or int4 target); an MTP
        # module is one of the target's own MoE layers (experts, latent attention and weight dtype).
        abytes = scenario.dtype_bytes
        if method == "mtp":
            experts = None if model.experts is None else replace(model.experts, dense_layers=0)
            # The model's own next-n layers unless the scenario sets draft.layers.
            layers = draft.layers if "layers" in draft.model_fields_set else (model.mtp_layers or draft.layers)
            head = stack_of(model, method, wbytes, layers=layers, lm_head_vocab=vocab,
                            extra_linears=extra, experts=experts)
        else:
            head = stack_of(model, method, abytes, layers=draft.layers, lm_head_vocab=vocab,
                            extra_linears=extra, experts=None, latent=None)
        # The fusion linear and a head's own LM head are priced at the activation dtype's bytes.
        resident = head.layers * head.layer_weight_bytes() + sum(i * o for i, o in extra) * abytes
        if vocab != model.vocab:   # a head with the target's vocabulary reuses its LM head
            resident += vocab * model.hidden * abytes
        return Stacks(target, head, draft_owns_kv=True, draft_weights_resident_bytes=resident,
                      draft_expert_bytes=head.layers * head.layer_expert_bytes())
    if method == "medusa":
        # One forward: a residual block (h x h) and an LM head per drafted position, no attention.
        heads = spec.draft_depth
        blocks = tuple((model.hidden, model.hidden) for _ in range(heads))
        head = Stack(name="medusa", shape=model, layers=0, weight_bytes=wbytes, lm_head_vocab=model.vocab,
                     lm_head_count=heads, extra_linears=blocks, attention=False)
        resident = heads * (model.hidden * model.hidden + model.vocab * model.hidden) * scenario.dtype_bytes
        return Stacks(target, head, draft_weights_resident_bytes=resident)
    if method == "shadow":
        qbytes = quantized_weight_bytes(draft.bits, draft.group_size)
        shadow = stack_of(model, "shadow", qbytes, lm_head_vocab=model.vocab)
        return Stacks(target, shadow, draft_weights_resident_bytes=model.layers * shadow.layer_weight_bytes())
    if method == "layerskip":
        return Stacks(target, stack_of(model, "layerskip", wbytes, layers=draft.exit_layer,
                                       lm_head_vocab=model.vocab))
    if method == "streaming":
        return Stacks(target, stack_of(model, "streaming", wbytes, lm_head_vocab=model.vocab,
                                       kv_window=spec.draft_kv_window))
    if method == "draft_model":
        dm = scenario.draft_spec
        assert dm is not None           # draft_model's spec (Scenario.draft_spec)
        small = stack_of(dm, dm.name, wbytes, lm_head_vocab=dm.vocab, kv_window=spec.draft_kv_window)
        return Stacks(target, small, draft_owns_kv=True, draft_weights_resident_bytes=dm.params * wbytes)
    raise AssertionError(method)
