"""A stack: the weights one forward reads and the operators it runs.

The target model, an EAGLE head, a shadow (quantized) copy, the first layers of the target, a
separate draft model: each is a run of identical decoder layers plus an LM head, differing only in
how many layers, how many bytes per weight, and how much KV its attention reads. Stacks are built
once per scenario (`build_stacks`); the cost models price them.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.scenario.presets import ModelSpec
from sim.scenario.schema import Scenario


@dataclass(frozen=True)
class Stack:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    weight_bytes: float          # bytes per decoder-layer weight (2 for bf16, ~0.56 for int4 g64)
    lm_head_vocab: int           # 0 when the forward needs no logits of its own
    lm_head_count: int = 1       # Medusa runs one LM head per drafted position
    # (in_features, out_features) linears run once per forward outside the decoder layers
    extra_linears: tuple[tuple[int, int], ...] = ()
    attention: bool = True
    kv_window: int | None = None  # attention reads at most this many KV tokens (streaming self-draft)

    @property
    def linears(self) -> tuple[tuple[str, int, int], ...]:
        """The decoder layer's linear operators as (name, in, out)."""
        return (("qkv", self.hidden, (self.heads + 2 * self.kv_heads) * self.head_dim),
                ("o", self.heads * self.head_dim, self.hidden),
                ("gate_up", self.hidden, 2 * self.ffn),
                ("down", self.ffn, self.hidden))

    @property
    def layer_weight_params(self) -> int:
        return sum(i * o for _, i, o in self.linears)

    def layer_weight_bytes(self) -> float:
        return self.layer_weight_params * self.weight_bytes


def stack_of(model: ModelSpec, name: str, weight_bytes: float, layers: int | None = None,
             **kw) -> Stack:
    return Stack(name=name, layers=model.layers if layers is None else layers, hidden=model.hidden,
                 heads=model.heads, kv_heads=model.kv_heads, head_dim=model.head_dim, ffn=model.ffn,
                 weight_bytes=weight_bytes, **kw)


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


def build_stacks(scenario: Scenario) -> Stacks:
    """The stacks one scenario runs: the target and, for model-based drafters, the draft."""
    model = scenario.model_spec
    wbytes = scenario.dtype_bytes
    target = stack_of(model, "target", wbytes, lm_head_vocab=model.vocab)
    spec = scenario.speculation
    draft = spec.draft
    method = spec.method
    if method in ("none", "ngram"):
        return Stacks(target, None)
    if method in ("eagle", "eagle3", "mtp"):
        vocab = draft.vocab or (32000 if method == "eagle3" else model.vocab)
        # EAGLE-3 fuses three target hidden states through a 3h -> h projection first.
        extra = ((3 * model.hidden, model.hidden),) if method == "eagle3" else ()
        head = stack_of(model, method, wbytes, layers=draft.layers, lm_head_vocab=vocab,
                        extra_linears=extra)
        resident = head.layers * head.layer_weight_bytes() + sum(i * o for i, o in extra) * wbytes
        if vocab != model.vocab:   # a head with the target's vocabulary reuses its LM head
            resident += vocab * model.hidden * wbytes
        return Stacks(target, head, draft_owns_kv=True, draft_weights_resident_bytes=resident)
    if method == "medusa":
        # One forward: a residual block (h x h) and an LM head per drafted position, no attention.
        heads = spec.draft_depth
        blocks = tuple((model.hidden, model.hidden) for _ in range(heads))
        head = Stack("medusa", 0, model.hidden, model.heads, model.kv_heads, model.head_dim, model.ffn,
                     wbytes, lm_head_vocab=model.vocab, lm_head_count=heads, extra_linears=blocks,
                     attention=False)
        resident = heads * (model.hidden * model.hidden + model.vocab * model.hidden) * wbytes
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
                                       kv_window=draft.kv_budget))
    if method == "draft_model":
        dm = scenario.draft_spec
        small = stack_of(dm, dm.name, wbytes, lm_head_vocab=dm.vocab)
        return Stacks(target, small, draft_owns_kv=True, draft_weights_resident_bytes=dm.params * wbytes)
    raise AssertionError(method)
