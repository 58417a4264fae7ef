"""A stack's roofline coefficients: what every priced forward of it reads, computed once.

Per decoder layer the four linears (their FLOPs, weight bytes and activation bytes per token), the
routed experts of an MoE layer, the elementwise bytes per token, attention's FLOPs and bytes per
query and KV token (MLA's absorbed form where the model has a latent), the query tiles an attention
kernel computes, and the LM head's; each operator's seconds at a token count from them over the
achievable rates (sim/cost/roofline.py RooflineRates), max(compute, memory) or the hardware's
smooth corner.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cost.batch import Group
from sim.cost.experts import busiest_gpu, distinct_experts
from sim.cost.stack import Stack

# Query tiles of a tensor-core attention kernel, in rows: the query tokens of one KV head's query
# heads are packed into the smallest tile that holds them, else into 128-row tiles, and every row of
# a tile is computed (FlashInfer's prefill and verify kernels choose 16, 64 or 128 rows this way).
ATTENTION_QUERY_TILES = (16, 64, 128)


@dataclass(frozen=True)
class LinearCost:
    flops_per_token: float
    weight_bytes: float
    act_bytes_per_token: float


class StackCost:
    """Per-stack coefficients, computed once so a forward is a few dozen float operations."""

    def __init__(self, stack: Stack, *, act_bytes: int, kv_bytes: int, tp: int, flops_s: float, attn_flops_s: float,
                 bytes_s: float, lm_head_bytes: int, corner: float | None, expert_parallel: bool = False,
                 weight_read_scale: float = 1.0, kernels=None, moe_gpus: int | None = None,
                 routed_elsewhere: bool = False, redundant_experts: int = 0):
        self.stack = stack
        # A published profile's layer kernels of this stack's shape (sim/cost/kernels.py), or None.
        self.kernels = kernels
        self.layers = stack.layers
        self.flops_s = flops_s
        self.attn_flops_s = attn_flops_s
        self.bytes_s = bytes_s
        self.corner = corner
        linear = lambda i, o, wbytes: LinearCost(2 * i * o / tp, i * o * wbytes / tp, (i + o) * act_bytes / tp)
        # Weights priced as the bytes that take as long to read at `bytes_s` (more where the
        # engine's quantized kernel reads slower than its 16-bit one).
        wbytes = stack.weight_bytes * weight_read_scale
        self.linears = [linear(i, o, wbytes) for _, i, o in stack.linears] if stack.layers else []
        self.dense_layers = stack.dense_layers
        self.moe_layers = stack.moe_layers
        self.experts = stack.experts
        # The GPUs the routed experts are spread over: the tensor-parallel group, or with attention
        # data parallel every rank's GPUs; routed_elsewhere: the experts are priced over every
        # rank's tokens by the step (RooflineRates.experts_time_s), not in a rank's own forward.
        moe_gpus = tp if moe_gpus is None else moe_gpus
        self.routed_elsewhere = routed_elsewhere
        if stack.experts is not None and stack.layers:
            e = stack.experts
            self.moe_linears = [linear(i, o, wbytes) for _, i, o in stack.moe_linears]
            # One routed expert on this GPU (each expert split across the MoE's GPUs).
            h, f = stack.hidden, 3 * e.ffn
            self.expert = LinearCost(2 * h * f / moe_gpus, h * f * wbytes / moe_gpus, (2 * h + f) * act_bytes / moe_gpus)
            # Expert parallelism: whole experts, routed / moe_gpus of them on each GPU; the busiest
            # GPU (most distinct experts, most token-expert pairs) sets the layer's time.
            self.expert_gpus = moe_gpus if expert_parallel else 1
            # Experts placed (redundant copies of the most used ones spread their tokens too).
            self.placed_experts = e.routed + redundant_experts
            if expert_parallel:
                self.expert = LinearCost(self.expert.flops_per_token * moe_gpus, self.expert.weight_bytes * moe_gpus,
                                      self.expert.act_bytes_per_token * moe_gpus)
        else:
            self.moe_linears = []
        self.extra_linears = [linear(i, o, lm_head_bytes) for i, o in stack.extra_linears]
        v = stack.lm_head_vocab * stack.lm_head_count
        self.lm_head = LinearCost(2 * stack.hidden * v / tp, stack.hidden * v * lm_head_bytes / tp,
                               (stack.hidden + v) * act_bytes / tp) if v else None
        heads = stack.heads / tp
        kv_heads = max(stack.kv_heads / tp, 1)
        # Elementwise bytes per token per layer: two RMSNorms and two residual adds over the hidden
        # state (read + write), RoPE over Q and K, SiLU(gate) * up over the FFN width.
        ffn = stack.ffn if stack.experts is None else stack.experts.ffn * (stack.experts.top_k + stack.experts.shared)
        self.elementwise_bytes_per_token = act_bytes * (10 * stack.hidden
                                                        + 2 * (heads + kv_heads) * stack.head_dim
                                                        + 3 * ffn / tp)
        if stack.latent is not None:
            # MLA in its absorbed form: every head scores against the shared latent (kv_rank +
            # rope_dim values) and sums the latent back (kv_rank); the latent is cached once per
            # token and layer, replicated on every tensor-parallel rank.
            a = stack.latent
            self.attn_flops_per_q_kv = 2 * heads * (a.kv_rank + a.rope_dim) + 2 * heads * a.kv_rank
            self.attn_bytes_per_kv = (a.kv_rank + a.rope_dim) * kv_bytes
            self.attn_bytes_per_q = heads * (a.kv_rank + a.rope_dim + a.kv_rank) * act_bytes
        else:
            self.attn_flops_per_q_kv = 4 * heads * stack.head_dim          # QK^T and PV
            self.attn_bytes_per_kv = 2 * kv_heads * stack.head_dim * kv_bytes
            self.attn_bytes_per_q = 2 * heads * stack.head_dim * act_bytes  # read q, write out
        # Query heads that read one KV head (MLA: every head reads the one latent).
        self.query_group = heads if stack.latent is not None else heads / kv_heads
        self._padded_query: dict[float, float] = {}
        # Below this many query tokens a request's attention is memory-bound at any KV length: the
        # largest query whose tile-padded rows stay under the ridge.
        ridge = self.attn_bytes_per_kv * attn_flops_s / (self.attn_flops_per_q_kv * bytes_s)
        query = 1
        while self.padded_query(query + 1) <= ridge:
            query += 1
        self.query_ridge = query if ridge >= 1 else ridge
        self.layer_weight_bytes = stack.layer_weight_params * stack.weight_bytes / tp
        self._request_attention: dict[tuple, float] = {}   # (query, kv) -> seconds, prefill chunks
        # Attention can be priced from KV sums alone unless a KV window clips each request.
        self.memory_bound_attention = stack.kv_window is None
        self.attends = stack.attention and stack.layers > 0
        # Below its ridge each linear is memory-bound, so up to the smallest ridge a set of them
        # costs (weight bytes + tokens x activation bytes) / bandwidth: a line in tokens. With a
        # soft corner or experts (weights read grow with tokens) there is no such line.
        self.closed_form = corner is None and not self.moe_layers and kernels is None
        self.layer_line = self.memory_bound_line(self.linears)
        self.extra_line = self.memory_bound_line(self.extra_linears)
        self.lm_line = self.memory_bound_line([self.lm_head] if self.lm_head is not None else [])

    def memory_bound_line(self, ops: list[LinearCost]) -> tuple[float, float, float]:
        """(seconds at zero tokens, seconds per token, largest token count where that is exact)."""
        ridge = float("inf")
        for op in ops:
            excess = op.flops_per_token / self.flops_s - op.act_bytes_per_token / self.bytes_s
            if excess > 0:
                ridge = min(ridge, op.weight_bytes / self.bytes_s / excess)
        return (sum(op.weight_bytes for op in ops) / self.bytes_s,
                sum(op.act_bytes_per_token for op in ops) / self.bytes_s, ridge)

    def combine(self, compute: float, memory: float) -> float:
        """A GEMM's seconds from its compute and memory times: the roofline's max, or with the
        hardware's corner p the smooth (compute^p + memory^p)^(1/p), which is 2^(1/p) times the max
        at the ridge and the max far from it."""
        larger = compute if compute > memory else memory
        if self.corner is None or larger == 0.0:
            return larger
        p = self.corner
        return larger * ((compute / larger) ** p + (memory / larger) ** p) ** (1.0 / p)

    def linear_time_s(self, ops: list[LinearCost], tokens: float) -> float:
        total = 0.0
        for op in ops:
            total += self.combine(tokens * op.flops_per_token / self.flops_s,
                                  (op.weight_bytes + tokens * op.act_bytes_per_token) / self.bytes_s)
        return total

    def distinct_experts(self, tokens: float) -> float:
        """Expected routed experts a forward of `tokens` tokens reads (sim/cost/experts.py)."""
        return distinct_experts(self.experts.routed, self.experts.top_k, tokens)

    def routed_time_s(self, tokens: float) -> float:
        """One MoE layer's routed experts: the weights of every expert some token picked, and
        top_k expert MLPs of compute per token (a grouped GEMM over the experts touched); with
        expert parallelism, those of the busiest GPU (sim/cost/experts.py)."""
        e = self.experts
        op = self.expert
        if self.expert_gpus > 1:
            experts, pairs = busiest_gpu(self.placed_experts, e.top_k, tokens, self.expert_gpus)
        else:
            experts, pairs = self.distinct_experts(tokens), tokens * e.top_k
        compute = pairs * op.flops_per_token / self.flops_s
        memory = (experts * op.weight_bytes + pairs * op.act_bytes_per_token) / self.bytes_s
        return self.combine(compute, memory)

    def layers_time_s(self, tokens: float) -> float:
        """Every decoder layer's linears (dense layers, and MoE layers' shared part and routed experts)."""
        if self.kernels is not None:
            return self.dense_layers * self.kernels.linears_s(tokens)
        total = self.dense_layers * self.linear_time_s(self.linears, tokens)
        if self.moe_layers:
            routed = 0.0 if self.routed_elsewhere else self.routed_time_s(tokens)
            total += self.moe_layers * (self.linear_time_s(self.moe_linears, tokens) + routed)
        return total

    def elementwise_s(self, tokens: float) -> float:
        """One layer's norms, RoPE, activation and residual adds: their bytes over the bandwidth, or
        the published kernels' time."""
        if self.kernels is not None:
            return self.kernels.elementwise_s(tokens)
        return tokens * self.elementwise_bytes_per_token / self.bytes_s

    def padded_query(self, query):
        """Query tokens an attention kernel computes for `query` tokens of one request (a number or
        an array): verification and prefill run a tensor-core kernel whose query tiles
        (ATTENTION_QUERY_TILES) are computed whole, so k + 1 tokens of a 32-head, 8-KV-head model
        (20 rows a KV head) cost a 64-row tile, 16 tokens' worth; a single decode token runs the
        decode kernel, which has no query tile."""
        if isinstance(query, np.ndarray):
            return self.padded_queries(query)
        if query <= 1:
            return query
        padded = self._padded_query.get(query)     # a scalar per iteration: memoized
        if padded is None:
            padded = self._padded_query[query] = float(self.padded_queries(np.asarray(float(query))))
        return padded

    def padded_queries(self, query: np.ndarray) -> np.ndarray:
        """padded_query of an array of per-request query tokens."""
        rows = query * self.query_group
        small, middle, large = ATTENTION_QUERY_TILES
        tile = np.where(rows <= small, small, np.where(rows <= middle, middle, large))
        return np.where(query <= 1, query, np.ceil(rows / tile) * tile / self.query_group)

    def attention_time_s(self, group: Group) -> float:
        """One layer's attention for a group of requests, each priced on its own roofline."""
        kv_window = self.stack.kv_window
        if group.query_max <= self.query_ridge and kv_window is None:
            return (group.kv_tokens_sum * self.attn_bytes_per_kv
                    + group.tokens * self.attn_bytes_per_q) / self.bytes_s
        n = max(group.requests, 1)
        q = group.query_tokens if group.query_tokens is not None else group.tokens / n
        kv = group.kv_tokens if group.kv_tokens is not None else np.full(n, group.kv_tokens_sum / n)
        if isinstance(kv, (list, tuple)):     # a few prefill chunks: plain floats beat numpy
            qs = [q] * len(kv) if isinstance(q, float) else q
            memo = self._request_attention
            total = 0.0
            for pair in zip(qs, kv):
                seconds = memo.get(pair)
                if seconds is None:
                    seconds = memo[pair] = self.request_attention_s(*pair)
                total += seconds
            return total
        if kv_window is not None:
            kv = np.minimum(kv, kv_window)
        # Causal attention inside a chunk of q new tokens touches q * (kv - (q - 1) / 2) pairs, in
        # tiles of padded rows.
        flops = self.attn_flops_per_q_kv * self.padded_query(q) * (kv - (np.asarray(q) - 1) / 2)
        bytes_ = kv * self.attn_bytes_per_kv + q * self.attn_bytes_per_q
        return float(np.maximum(flops / self.attn_flops_s, bytes_ / self.bytes_s).sum())

    def request_attention_s(self, query: float, kv: float) -> float:
        """One request's attention in one layer: query tokens against kv tokens (the query's own
        included), causal among the new tokens."""
        if self.stack.kv_window is not None:
            kv = min(kv, self.stack.kv_window)
        compute = self.attn_flops_per_q_kv * self.padded_query(query) * (kv - (query - 1) / 2) / self.attn_flops_s
        memory = (kv * self.attn_bytes_per_kv + query * self.attn_bytes_per_q) / self.bytes_s
        return compute if compute > memory else memory
