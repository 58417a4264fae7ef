"""The roofline cost model: the time of a forward from a datasheet and an engine preset.

Every operator costs max(FLOPs / achievable FLOP rate, bytes / achievable bandwidth), where
achievable = datasheet x the engine preset's efficiency. Per decoder layer a forward runs four
linears (QKV, O, gate+up, down) that see the batch's total query tokens, elementwise work (norms,
RoPE, residuals, SiLU) proportional to tokens, and attention that is priced per request from its own
query and KV tokens. The LM head runs on the tokens that need logits. Tensor parallelism splits
weights and heads and adds two all-reduces per layer; offloaded layers stream their weights over the
host link once per forward, overlapped with compute when asked.

Prices come in two parts, as every cost model here composes them (sim/cost/model.py): a pricer per
stack (`RooflinePricer`: its forwards and SpecPV's block selection, from each stack's coefficients,
sim/cost/coefficients.py, composed by sim/cost/compose.py) and the engine's host work
(sim/cost/host.py `RooflineHost`: each step's, speculation's, prompt lookup's). The simulator never sees how a time
was computed, so operator tables or an engine timed whole price a stack instead without touching
the simulation (Vidur's predictor pattern).
"""
from __future__ import annotations

import math

from sim.cost.batch import SELECTION
from sim.cost.coefficients import StackCost
from sim.cost.collectives import all_to_all_for, collectives_for
from sim.cost.compose import compose, with_transfer
from sim.cost.stack import Stack
from sim.cost.work import AllReduce, AllToAll, Forward, Selection, UniformForward
from sim.scenario.schema import Scenario


class RooflineRates:
    """What every roofline price of one scenario reads: the achievable rates (datasheet x the engine
    preset's efficiencies), parallelism, the host link, and the engine's per-layer and per-forward
    host terms; with each stack's coefficients (`stack_cost`) and the composition of a forward from
    its terms (`compose`), which the operator tables' pricer shares (sim/cost/table.py)."""

    def __init__(self, scenario: Scenario, link_gb_s: float | None = None, kernels=None, all_reduce=None,
                 all_to_all=None):
        hw = scenario.hardware_spec
        self.kernels = kernels      # sim/cost/kernels.py LayerKernels, for the stacks it fits
        engine = scenario.engine_spec
        self.engine = engine
        self.tp = scenario.tensor_parallel
        self.data_parallel = scenario.data_parallel
        self.gpus = scenario.gpus
        self.expert_parallel = scenario.expert_parallel
        self.redundant_experts = scenario.redundant_experts
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
        # An all-reduce's price: the one given (the measured operator tables'), else a published
        # table where one matches, else the guess (warned).
        self.collectives: AllReduce
        self.collectives, collectives_warning = (all_reduce, None) if all_reduce is not None else \
            collectives_for(scenario)
        # Expert parallelism's all-to-all: the one given (DeepEP's, measured), else the published
        # table the engine names, else the guess (warned).
        self.all_to_all: AllToAll
        self.all_to_all, all_to_all_warning = (all_to_all, None) if all_to_all is not None else \
            all_to_all_for(scenario)
        self.warnings = [w for w in (collectives_warning, all_to_all_warning) if w]
        self.overlap_transfer = scenario.offload.overlap
        self._stacks: dict[int, StackCost] = {}
        self._batch_terms: dict[tuple, tuple[float, float]] = {}

    def stack_cost(self, stack: Stack) -> StackCost:
        cost = self._stacks.get(id(stack))
        if cost is None:
            cost = StackCost(stack, act_bytes=self.act_bytes, kv_bytes=self.kv_bytes, tp=self.tp,
                              flops_s=self.flops_s, attn_flops_s=self.attn_flops_s, bytes_s=self.bytes_s,
                              lm_head_bytes=self.act_bytes, corner=self.corner,
                              expert_parallel=self.expert_parallel, moe_gpus=self.gpus,
                              routed_elsewhere=self.data_parallel > 1, redundant_experts=self.redundant_experts,
                              weight_read_scale=self.int4_read_scale if stack.weight_bytes < self.act_bytes else 1.0,
                              kernels=self.kernels if self.kernels is not None and self.kernels.fits(stack) else None)
            self._stacks[id(stack)] = cost
        return cost

    def allreduce_time_s(self, message_bytes: float) -> float:
        """All-reduce of one layer's output across the tensor-parallel group (sim/cost/collectives.py)."""
        if self.tp == 1:
            return 0.0
        return self.collectives.all_reduce_s(message_bytes, self.tp)

    def collectives_time_s(self, c: StackCost, tokens: float) -> float:
        """A forward's collectives over every layer: two all-reduces a layer (after attention and
        after the MLP); under expert parallelism an MoE layer's second is the all-to-all instead,
        the dispatch of each GPU's share of the tokens to their top-k experts and the combine back."""
        if self.tp == 1:
            return 0.0
        reduce = self.allreduce_time_s(tokens * c.stack.hidden * self.act_bytes)
        if self.data_parallel > 1:
            # An attention rank's own: after attention and a dense MLP; an MoE layer's exchange
            # across the ranks is the step's (experts_time_s).
            return (c.layers + c.dense_layers) * reduce
        if not (self.expert_parallel and c.moe_layers):
            return 2 * c.layers * reduce
        elements = math.ceil(tokens / self.tp) * c.stack.experts.top_k * c.stack.hidden
        return ((c.layers + c.dense_layers) * reduce
                + c.moe_layers * self.all_to_all.exchange_s(elements, self.tp, self.act_bytes))

    def experts_time_s(self, c: StackCost, tokens: float, rank_tokens: float, routed_s: float) -> tuple[float, float]:
        """Attention data parallel: every MoE layer's routed experts (`routed_s`, one layer's, over
        all ranks' `tokens`) and their exchange across all GPUs, the busiest rank sending
        `rank_tokens`: expert parallelism's dispatch and combine of each GPU's share of its rank's
        tokens, else an all-gather of every rank's tokens before the split experts and a
        reduce-scatter after (one all-reduce's traffic). Returns (experts, exchange) seconds."""
        if not c.moe_layers or tokens <= 0:
            return 0.0, 0.0
        hidden = c.stack.hidden
        if self.expert_parallel:
            elements = math.ceil(rank_tokens / self.tp) * c.stack.experts.top_k * hidden
            exchange = self.all_to_all.exchange_s(elements, self.gpus, self.act_bytes)
        else:
            exchange = self.collectives.all_reduce_s(tokens * hidden * self.act_bytes, self.gpus)
        return c.moe_layers * routed_s, c.moe_layers * exchange

    def batch_terms_s(self, c: StackCost, tokens: float, logits: float) -> tuple[float, float]:
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

    def experts_s(self, tokens: float, rank_tokens: float) -> tuple[float, float]:
        """Attention data parallel: the MoE layers' routed experts over every rank's `tokens` and
        their exchange, (experts, exchange) seconds (RooflineRates.experts_time_s)."""
        c = self.c
        return self.rates.experts_time_s(c, tokens, rank_tokens, c.routed_time_s(tokens) if c.moe_layers else 0.0)

    def forward(self, forward: Forward, shares: list[float]) -> float:
        """Seconds of `forward.repeat` identical forwards of the stack over `forward.groups`; adds
        each phase's part into `shares`.

        Work shared by the batch (linears, elementwise, all-reduce, launches) is split among the
        groups by their share of query tokens; attention and LM head are each group's own.
        `repeat` prices sequential draft forwards that differ only by a token of KV each: give the
        groups their mean KV, which is exact while attention is memory-bound (linear in KV).
        A roofline prices a draft forward itself, whatever the step's drafts (`draft_k`).
        """
        c = self.c
        groups = forward.groups
        tokens = 0
        logits = 0
        for g in groups:
            tokens += g.tokens
            logits += g.logits_tokens
        if tokens == 0:
            return 0.0
        shared, lm_head = self.rates.batch_terms_s(c, tokens, logits)
        attention_of = c.attention_time_s if self.stack.attention and c.layers else None
        return compose(self.rates, groups, tokens, logits, shared, lm_head, attention_of, c, shares,
                                  forward.offloaded_layers, forward.kv_offloaded, forward.repeat)

    def forward_uniform(self, forward: UniformForward, shares: list[float]) -> float:
        """`forward` over one group, without building it while attention is memory-bound: the hot
        path of decode, verify and draft forwards (each request's KV, `forward.context` +
        `kv_offset`, is read only off that path: long queries, a KV window, offloading)."""
        f = forward
        tokens = f.tokens
        if tokens is None:
            tokens = f.requests * f.query
        logits_tokens = f.logits_tokens
        if logits_tokens is None:
            logits_tokens = tokens
        terms = self._uniform_terms.get((tokens, logits_tokens))
        if terms is None:
            terms = self.uniform_terms_s(tokens, logits_tokens)
        fixed_s, per_kv_s, query_ridge, c = terms
        if f.query > query_ridge or f.kv_offloaded:
            return self.forward(f.as_forward(kv_per_request=True), shares)
        total = fixed_s + f.kv_tokens_sum * per_kv_s
        repeat = f.repeat
        shares[f.phase] += total * repeat
        if f.offloaded_layers:
            return with_transfer(self.rates, total, f.offloaded_layers * c.layer_weight_bytes / self.rates.link_bytes_s,
                                            shares, repeat)
        return total * repeat

    def uniform_terms_s(self, tokens: float, logits: float) -> tuple[float, float, float, StackCost]:
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

    def selection(self, selection: Selection, shares: list[float]) -> float:
        """SpecPV block selection in every layer.

        part "refresh" (a full verification re-selecting for the partial steps that follow): read
        each block's key max and min, score them with the step's queries, and copy the selected
        blocks' K and V into the partial cache (read + write). "summaries": only take the blocks'
        key max and min (read the context's keys once). "scores": score and pick without copying
        (the partial attention then reads the chosen positions where they are).
        """
        requests, context_sum, part = selection.requests, selection.context_sum, selection.part
        if requests == 0:
            return 0.0
        budget_tokens, block_tokens, query_tokens_sum = (selection.budget_tokens, selection.block_tokens,
                                                         selection.query_tokens_sum)
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
