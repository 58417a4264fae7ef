"""A decoder layer's linears and elementwise kernels priced from a published profile of the same
model shape (`calibration: calibration/published/<kernels>`, sim/formats/published.py): each
layer's four linears and its norms, RoPE, activation and adds read at the scenario's token count
and tensor-parallel size; the roofline keeps attention, the LM head, collectives, host work and
every stack of another shape (a draft model, a quantized shadow, a head's fusion linear)."""
from __future__ import annotations

from sim.formats.provenance import repo_relative
from sim.formats.published import PublishedProfile, layer_shape, timed_layer_shape

LINEARS = ("linear.qkv", "linear.o", "linear.gate_up", "linear.down")


class LayerKernels:
    """Seconds of one decoder layer's linears and elementwise kernels at `tp` GPUs, by tokens."""

    def __init__(self, profile: PublishedProfile, tp: int, act_bytes: int):
        self.profile = profile
        self.tp = tp
        self.act_bytes = act_bytes
        # Every kernel profile times all five (sim/imports/kernels.py OPS).
        self.linears = [profile.tables[op] for op in LINEARS]
        self.elementwise = profile.tables["elementwise"]
        self.origin = (f"published kernels {repo_relative(profile.path)} (linears and elementwise, measured on "
                       f"{profile.meta['hardware']}), the roofline for attention and the LM head")
        self._linears_s: dict[float, float] = {}
        self._elementwise_s: dict[float, float] = {}

    def fits(self, stack) -> bool:
        """Did the profile time this stack's layers: the model's shape, dense, 16-bit weights?"""
        return (stack.layers > 0 and stack.attention and stack.experts is None and stack.latent is None
                and stack.weight_bytes == self.act_bytes
                and layer_shape(stack) == timed_layer_shape(self.profile.meta))

    def linears_s(self, tokens: float) -> float:
        s = self._linears_s.get(tokens)
        if s is None:
            s = self._linears_s[tokens] = sum(table(self.tp, tokens) for table in self.linears)
        return s

    def elementwise_s(self, tokens: float) -> float:
        s = self._elementwise_s.get(tokens)
        if s is None:
            s = self._elementwise_s[tokens] = self.elementwise(self.tp, tokens)
        return s
