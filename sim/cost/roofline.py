"""The roofline cost model: the time of a forward from a datasheet and an engine preset.

Every operator costs max(FLOPs / achievable FLOP rate, bytes / achievable bandwidth), where
achievable = datasheet x the engine preset's efficiency. Per decoder layer a forward runs four
linears (QKV, O, gate+up, down) that see the batch's total query tokens, elementwise work (norms,
RoPE, residuals, SiLU) proportional to tokens, and attention that is priced per request from its own
query and KV tokens. The LM head runs on the tokens that need logits. Tensor parallelism splits
weights and heads and adds two all-reduces per layer; offloaded layers stream their weights over the
host link once per forward, overlapped with compute when asked.

Prices come in two parts, as every cost model here composes them (sim/cost/model.py): a pricer per
stack (`RooflinePricer`: its forwards and SpecPV's block selection) and the engine's host work
(`RooflineHost`: each step's, speculation's, prompt lookup's). The simulator never sees how a time
was computed, so operator tables or an engine timed whole price a stack instead without touching
the simulation (Vidur's predictor pattern).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sim.cost.batch import DRAFT, OVERHEAD, PARTIAL, SELECTION, TRANSFER, Group
from sim.cost.collectives import all_to_all_for, collectives_for
from sim.cost.experts import busiest_gpu, distinct_experts
from sim.cost.stack import Stack
from sim.scenario.schema import Scenario

# Query tiles of a tensor-core attention kernel, in rows: the query tokens of one KV head's query
# heads are packed into the smallest tile that holds them, else into 128-row tiles, and every row of
# a tile is computed (FlashInfer's prefill and verify kernels choose 16, 64 or 128 rows this way).
ATTENTION_QUERY_TILES = (16, 64, 128)


@dataclass(frozen=True)
class _Linear:
    flops_per_token: float
    weight_bytes: float
    act_bytes_per_token: float


class _StackCost:
    """Per-stack coefficients, computed once so a forward is a few dozen float operations."""

    def __init__(self, stack: Stack, *, act_bytes: int, kv_bytes: int, tp: int, flops_s: float, attn_flops_s: float,
                 bytes_s: float, lm_head_bytes: int, corner: float | None, expert_parallel: bool = False,
                 weight_read_scale: float = 1.0, kernels=None):
        self.stack = stack
        # A published profile's layer kernels of this stack's shape (sim/cost/kernels.py), or None.
        self.kernels = kernels
        self.layers = stack.layers
        self.flops_s = flops_s
        self.attn_flops_s = attn_flops_s
        self.bytes_s = bytes_s
        self.corner = corner
        linear = lambda i, o, wbytes: _Linear(2 * i * o / tp, i * o * wbytes / tp, (i + o) * act_bytes / tp)
        # Weights priced as the bytes that take as long to read at `bytes_s` (more where the
        # engine's quantized kernel reads slower than its 16-bit one).
        wbytes = stack.weight_bytes * weight_read_scale
        self.linears = [linear(i, o, wbytes) for _, i, o in stack.linears] if stack.layers else []
        self.dense_layers = stack.dense_layers
        self.moe_layers = stack.moe_layers
        self.experts = stack.experts
        if stack.experts is not None and stack.layers:
            e = stack.experts
            self.moe_linears = [linear(i, o, wbytes) for _, i, o in stack.moe_linears]
            # One routed expert on this GPU (each expert split across the tensor-parallel ranks).
            self.expert = linear(stack.hidden, 3 * e.ffn, wbytes)
            self.expert = _Linear(self.expert.flops_per_token, self.expert.weight_bytes,
                                  (2 * stack.hidden + 3 * e.ffn) * act_bytes / tp)
            # Expert parallelism: whole experts, routed / tp of them on each GPU; the busiest GPU
            # (most distinct experts, most token-expert pairs) sets the layer's time.
            self.expert_gpus = tp if expert_parallel else 1
            if expert_parallel:
                self.expert = _Linear(self.expert.flops_per_token * tp, self.expert.weight_bytes * tp,
                                      self.expert.act_bytes_per_token * tp)
        else:
            self.moe_linears = []
        self.extra_linears = [linear(i, o, lm_head_bytes) for i, o in stack.extra_linears]
        v = stack.lm_head_vocab * stack.lm_head_count
        self.lm_head = _Linear(2 * stack.hidden * v / tp, stack.hidden * v * lm_head_bytes / tp,
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

    def memory_bound_line(self, ops: list[_Linear]) -> tuple[float, float, float]:
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

    def linear_time_s(self, ops: list[_Linear], tokens: float) -> float:
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
            experts, pairs = busiest_gpu(e.routed, e.top_k, tokens, self.expert_gpus)
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
            total += self.moe_layers * (self.linear_time_s(self.moe_linears, tokens) + self.routed_time_s(tokens))
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
            qs = q if isinstance(q, (list, tuple)) else [q] * len(kv)
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


class RooflineRates:
    """What every roofline price of one scenario reads: the achievable rates (datasheet x the engine
    preset's efficiencies), parallelism, the host link, and the engine's per-layer and per-forward
    host terms; with each stack's coefficients (`stack_cost`) and the composition of a forward from
    its terms (`compose`), which the operator tables' pricer shares (sim/cost/table.py)."""

    def __init__(self, scenario: Scenario, link_gb_s: float | None = None, kernels=None):
        hw = scenario.hardware_spec
        self.kernels = kernels      # sim/cost/kernels.py LayerKernels, for the stacks it fits
        engine = scenario.engine_spec
        self.engine = engine
        self.tp = scenario.tensor_parallel
        self.expert_parallel = scenario.expert_parallel
        self.act_bytes = scenario.dtype_bytes
        self.kv_bytes = scenario.kv_bytes
        self.flops_s = hw.peak_tflops(scenario.gemm_dtype) * 1e12 * engine.compute_efficiency
        self.attn_flops_s = hw.peak_tflops(scenario.activation_dtype) * 1e12 * engine.compute_efficiency
        self.corner = hw.gemm_corner
        # Quantized (int4) decoder weights read at the engine's int4 efficiency, not its 16-bit one.
        self.int4_read_scale = (engine.mem_efficiency / engine.int4_mem_efficiency
                                if scenario.dtype == "int4" and engine.int4_mem_efficiency else 1.0)
        self.bytes_s = hw.hbm_gb_s * 1e9 * engine.mem_efficiency
        self.link_bytes_s = (link_gb_s or hw.host_link_gb_s * engine.link_efficiency) * 1e9
        # An all-reduce's price: a published table where one matches, else the guess (warned).
        self.collectives, collectives_warning = collectives_for(scenario)
        # Expert parallelism's all-to-all: the published table the engine names, else the guess (warned).
        self.all_to_all, all_to_all_warning = all_to_all_for(scenario)
        self.warnings = [w for w in (collectives_warning, all_to_all_warning) if w]
        self.overlap_transfer = scenario.offload.overlap
        self._stacks: dict[int, _StackCost] = {}
        self._batch_terms: dict[tuple, tuple[float, float]] = {}

    def stack_cost(self, stack: Stack) -> _StackCost:
        cost = self._stacks.get(id(stack))
        if cost is None:
            cost = _StackCost(stack, act_bytes=self.act_bytes, kv_bytes=self.kv_bytes, tp=self.tp,
                              flops_s=self.flops_s, attn_flops_s=self.attn_flops_s, bytes_s=self.bytes_s,
                              lm_head_bytes=self.act_bytes, corner=self.corner,
                              expert_parallel=self.expert_parallel,
                              weight_read_scale=self.int4_read_scale if stack.weight_bytes < self.act_bytes else 1.0,
                              kernels=self.kernels if self.kernels is not None and self.kernels.fits(stack) else None)
            self._stacks[id(stack)] = cost
        return cost

    def allreduce_time_s(self, message_bytes: float) -> float:
        """All-reduce of one layer's output across the tensor-parallel group (sim/cost/collectives.py)."""
        if self.tp == 1:
            return 0.0
        return self.collectives.all_reduce_s(message_bytes, self.tp)

    def collectives_time_s(self, c: _StackCost, tokens: float) -> float:
        """A forward's collectives over every layer: two all-reduces a layer (after attention and
        after the MLP); under expert parallelism an MoE layer's second is the all-to-all instead,
        the dispatch of each GPU's share of the tokens to their top-k experts and the combine back."""
        if self.tp == 1:
            return 0.0
        reduce = self.allreduce_time_s(tokens * c.stack.hidden * self.act_bytes)
        if not (self.expert_parallel and c.moe_layers):
            return 2 * c.layers * reduce
        elements = math.ceil(tokens / self.tp) * c.stack.experts.top_k * c.stack.hidden
        return ((c.layers + c.dense_layers) * reduce
                + c.moe_layers * self.all_to_all.exchange_s(elements, self.tp, self.act_bytes))

    def compose(self, groups: Sequence[Group], tokens: int, logits: int, shared: float, lm_head: float,
                attention_of, c, shares: list[float], offloaded_layers: int, kv_offloaded: bool,
                repeat: int) -> float:
        """A forward's seconds from its terms: `shared` (split among the groups by query tokens),
        `lm_head` (by logits tokens), one layer's attention per group (`attention_of(group)`, or
        None for a stack without attention) times c.layers, and the host-link transfer of the
        offloaded layers and KV; each group's part goes to its phase in `shares`."""
        total = shared + lm_head
        kv_link_bytes = 0.0
        for g in groups:
            own = shared * g.tokens / tokens + (lm_head * g.logits_tokens / logits if logits else 0.0)
            if attention_of is not None:
                attention = c.layers * attention_of(g)
                own += attention
                total += attention
                if kv_offloaded and g.phase != PARTIAL:
                    kv_link_bytes += c.layers * g.kv_tokens_sum * c.attn_bytes_per_kv
            shares[g.phase] += own * repeat
        transfer = (offloaded_layers * c.layer_weight_bytes + kv_link_bytes) / self.link_bytes_s
        return self.with_transfer(total, transfer, shares, repeat)

    def with_transfer(self, compute_s: float, transfer_s: float, shares: list[float], repeat: int) -> float:
        """`repeat` forwards of compute_s each streaming transfer_s over the host link: the part of
        the transfer not hidden behind compute (all of it without overlap) is the `transfer` phase."""
        if transfer_s:
            exposed = max(0.0, transfer_s - compute_s) if self.overlap_transfer else transfer_s
            shares[TRANSFER] += exposed * repeat
            compute_s += exposed
        return compute_s * repeat

    def batch_terms_s(self, c: _StackCost, tokens: float, logits: float) -> tuple[float, float]:
        """(shared, LM head) seconds of one forward of `tokens` query tokens, memoized: a serving
        run meets the same batch sizes again and again."""
        layer_w, layer_a, layer_ridge = c.layer_line
        extra_w, extra_a, extra_ridge = c.extra_line
        lm_w, lm_a, lm_ridge = c.lm_line
        layer_overhead = self.engine.layer_overhead_s
        if self.engine.graph_max_tokens and tokens > self.engine.graph_max_tokens:
            layer_overhead += self.engine.eager_layer_overhead_s    # past the CUDA-graph cap: eager
        if c.closed_form and tokens <= layer_ridge and tokens <= extra_ridge and logits <= lm_ridge:
            # Every linear memory-bound: the closed form, no loop, no memo.
            shared = (c.layers * (layer_w + tokens * (layer_a + c.elementwise_bytes_per_token / c.bytes_s)
                                  + layer_overhead)
                      + self.collectives_time_s(c, tokens) + extra_w + tokens * extra_a
                      + self.engine.forward_overhead_s)
            return shared, (lm_w + logits * lm_a if logits else 0.0)
        key = (id(c), tokens, logits)
        terms = self._batch_terms.get(key)
        if terms is None:
            layers = c.layers
            shared = (c.layers_time_s(tokens) + layers * (c.elementwise_s(tokens) + layer_overhead)
                      + self.collectives_time_s(c, tokens)
                      + c.linear_time_s(c.extra_linears, tokens) + self.engine.forward_overhead_s)
            lm_head = c.linear_time_s([c.lm_head], logits) if c.lm_head is not None and logits else 0.0
            terms = (shared, lm_head)
            if len(self._batch_terms) < 1 << 16:
                self._batch_terms[key] = terms
        return terms


class RooflinePricer:
    """One stack's forwards and SpecPV block selection from the roofline: every operator
    max(FLOPs / achievable FLOP rate, bytes / achievable bandwidth) (the module docstring)."""
    origin = "roofline"

    def __init__(self, stack: Stack, rates: RooflineRates):
        self.stack = stack
        self.rates = rates
        self.c = rates.stack_cost(stack)
        self._uniform_terms: dict[tuple, tuple] = {}

    def needs_kv_tokens(self, query: int) -> bool:
        """Does pricing a group of `query`-token requests need each request's KV, not just the sum?"""
        return query > self.c.query_ridge or not self.c.memory_bound_attention

    def forward(self, groups: Sequence[Group], shares: list[float], offloaded_layers: int = 0,
                kv_offloaded: bool = False, repeat: int = 1, draft_k: int | None = None) -> float:
        """Seconds of `repeat` identical forwards of the stack over `groups`; adds each phase's part
        into `shares`.

        Work shared by the batch (linears, elementwise, all-reduce, launches) is split among the
        groups by their share of query tokens; attention and LM head are each group's own.
        `repeat` prices sequential draft forwards that differ only by a token of KV each: give the
        groups their mean KV, which is exact while attention is memory-bound (linear in KV).
        draft_k: the step's drafts a draft forward is one of (what an engine timed whole prices by;
        a roofline prices the forward itself).
        """
        c = self.c
        tokens = 0
        logits = 0
        for g in groups:
            tokens += g.tokens
            logits += g.logits_tokens
        if tokens == 0:
            return 0.0
        shared, lm_head = self.rates.batch_terms_s(c, tokens, logits)
        attention_of = c.attention_time_s if self.stack.attention and c.layers else None
        return self.rates.compose(groups, tokens, logits, shared, lm_head, attention_of, c, shares,
                                  offloaded_layers, kv_offloaded, repeat)

    def forward_uniform(self, phase: int, requests: int, query: int, kv_tokens_sum: float, shares: list[float],
                        tokens: int | None = None, logits_tokens: int | None = None,
                        context: np.ndarray | None = None, kv_offset: float = 0, offloaded_layers: int = 0,
                        kv_offloaded: bool = False, repeat: int = 1, draft_k: int | None = None) -> float:
        """`forward` over one group, without building it while attention is memory-bound: the hot
        path of decode, verify and draft forwards.

        query: each request's query tokens (the largest, when `tokens` gives a ragged total);
        tokens: the group's query tokens, default requests x query; logits_tokens: default tokens.
        context: per-request tokens [n], of which each request reads context + kv_offset; needed
        only off the memory-bound path (long queries, a KV window, offloading)."""
        if tokens is None:
            tokens = requests * query
        if logits_tokens is None:
            logits_tokens = tokens
        terms = self._uniform_terms.get((tokens, logits_tokens))
        if terms is None:
            terms = self.uniform_terms_s(tokens, logits_tokens)
        fixed_s, per_kv_s, query_ridge, c = terms
        if query > query_ridge or kv_offloaded:
            kv = context + kv_offset if context is not None else None
            group = Group(phase=phase, requests=requests, tokens=tokens, query_max=query, kv_tokens_sum=kv_tokens_sum,
                          logits_tokens=logits_tokens, kv_tokens=kv)
            return self.forward([group], shares, offloaded_layers, kv_offloaded, repeat)
        total = fixed_s + kv_tokens_sum * per_kv_s
        shares[phase] += total * repeat
        if offloaded_layers:
            return self.rates.with_transfer(total, offloaded_layers * c.layer_weight_bytes / self.rates.link_bytes_s,
                                            shares, repeat)
        return total * repeat

    def uniform_terms_s(self, tokens: float, logits: float) -> tuple[float, float, float, _StackCost]:
        """A memory-bound forward as (fixed seconds, seconds per KV token read), with the largest
        query that keeps it memory-bound (-1 when a KV window needs per-request pricing); memoized."""
        c = self.c
        shared, lm_head = self.rates.batch_terms_s(c, tokens, logits)
        attends = 1.0 if c.attends else 0.0
        ridge = c.query_ridge if c.memory_bound_attention else -1.0
        terms = (shared + lm_head + attends * c.layers * tokens * c.attn_bytes_per_q / c.bytes_s,
                 attends * c.layers * c.attn_bytes_per_kv / c.bytes_s, ridge, c)
        if len(self._uniform_terms) < 1 << 16:
            self._uniform_terms[(tokens, logits)] = terms
        return terms

    def selection(self, requests: int, context_sum: int, query_tokens_sum: int, budget_tokens: int,
                  block_tokens: int, shares: list[float], part: str = "refresh") -> float:
        """SpecPV block selection in every layer.

        part "refresh" (a full verification re-selecting for the partial steps that follow): read
        each block's key max and min, score them with the step's queries, and copy the selected
        blocks' K and V into the partial cache (read + write). "summaries": only take the blocks'
        key max and min (read the context's keys once). "scores": score and pick without copying
        (the partial attention then reads the chosen positions where they are).
        """
        if requests == 0:
            return 0.0
        c = self.c
        blocks = context_sum / block_tokens
        summary_bytes = 2 * blocks * c.attn_bytes_per_kv          # k_max and k_min, K side only
        if part == "summaries":
            per_layer = (context_sum * c.attn_bytes_per_kv / 2 + summary_bytes) / c.bytes_s
        else:
            gather_bytes = 2 * requests * budget_tokens * c.attn_bytes_per_kv if part == "refresh" else 0.0
            flops = 2 * c.attn_flops_per_q_kv / 2 * blocks * max(query_tokens_sum / requests, 1)
            per_layer = max(flops / c.attn_flops_s, (summary_bytes + gather_bytes) / c.bytes_s)
        seconds = c.layers * (per_layer + self.rates.engine.layer_overhead_s)
        shares[SELECTION] += seconds
        return seconds


class RooflineHost:
    """The engine preset's host work: every step's, speculation's, and prompt lookup's."""

    def __init__(self, engine):
        self.engine = engine
        self.origin = f"engine preset {engine.name}"

    def host_draft(self, requests: int, shares: list[float], context_tokens: float | None = None) -> float:
        """Prompt-lookup drafting on the host, one lookup per request (the engine preset's time,
        whatever the context)."""
        seconds = requests * self.engine.ngram_lookup_s
        shares[DRAFT] += seconds
        return seconds

    def speculation_overhead(self, requests: int, draft_forwards: int, shares: list[float]) -> float:
        """The engine's host work of one speculative step over `requests` requests: the step's own
        (sampling, acceptance, tree bookkeeping), per request, and each draft forward's."""
        step = self.engine.speculation_step_overhead_s + requests * self.engine.speculation_request_overhead_s
        drafts = draft_forwards * self.engine.draft_forward_overhead_s
        shares[OVERHEAD] += step
        shares[DRAFT] += drafts
        return step + drafts

    def step_overhead(self, requests: int, shares: list[float], verify_tokens: int = 1) -> float:
        """The engine's host work of one iteration over `requests` requests (the preset's per step
        and per request; verify_tokens does not change it here, only in a calibrated bundle)."""
        seconds = self.engine.step_overhead_s + requests * self.engine.request_overhead_s
        shares[OVERHEAD] += seconds
        return seconds
