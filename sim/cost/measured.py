"""A stack priced from the field's measured operator tables (aiconfigurator-core,
sim/cost/measured_tables.py) for the scenario's GPU and engine.

A forward is composed as the roofline composes it (sim/cost/compose.py); only the source of each
term changes, and each term records where its figures came from, lookup by lookup (`terms`):

    linears      each decoder layer's GEMMs at (k, m = the forward's tokens, n) as this GPU's
                 tensor-parallel rank runs them (QKV and gate/up split by output, O and down by
                 input), from the GEMM table of the stack's weight dtype
    moe          an MoE layer's routed experts: the fused-MoE table at the stack's exact expert
                 shape, MoE TP and EP (its attention, router and shared experts are linears)
    attention    one query token a row: the generation table at (requests, KV tokens); a whole
                 prompt: the context table at (requests, prompt tokens); verification's k + 1 (or a
                 tree's) query tokens: the generation row at the same KV plus the roofline's time of
                 the queries past the first (the verify shape, docs/architecture.md "Measured
                 terms"); a chunk after a cached prefix and a tree past the roofline's memory-bound
                 query: the generation or context row the roofline adds less to, plus what it adds
    lm_head      a GEMM at (hidden, logits tokens, vocabulary / TP)
    all_reduce   the engine's custom all-reduce table at the scenario's GPU count
    elementwise  norms, RoPE, activation, residuals: the roofline (the tables time none)

Origins: `measured` (inside a table's grid, interpolated in log space), `extrapolated` (beyond it:
the nearest measured point scaled by the roofline's ratio, or an attention table's nearest head
count), `roofline` (no table for the term). Host work stays the engine's own model on top.
"""
from __future__ import annotations

import math

from sim.cost.batch import Group
from sim.cost.compose import compose, token_counts, with_transfer
from sim.cost.decode_rows import DecodeRow
from sim.cost.log_grid import LogGrid
from sim.cost.measured_model import TermOrigins, describe
from sim.cost.measured_tables import TABLE_DTYPE, OperatorTables
from sim.cost.roofline import RooflinePricer, RooflineRates
from sim.cost.stack import Stack
from sim.cost.work import Forward, Selection, UniformForward

# Linears a tensor-parallel rank splits by input (row parallel); every other is split by output.
ROW_PARALLEL = ("o", "down", "shared_down")
# Linears every rank runs whole.
REPLICATED = ("router",)
# Weight dtypes of a fused-MoE table to try, by bytes per weight (the first the table has).
MOE_DTYPES = {2: ("bfloat16",), 1: ("fp8", "fp8_block")}


def decode_shape(kv: float) -> tuple[float, float]:
    """What a generation-attention row times a request: one query token over `kv` KV tokens."""
    return (1.0, kv)


def prompt_shape(tokens: float) -> tuple[float, float]:
    """What a context-attention row times a request: a prompt of `tokens` over its own KV."""
    return (tokens, tokens)


def kept(cuts: dict, requests: int, make):
    """cuts[requests], made by `make()` the first time (a grid cut at one request count; a few
    thousand kept at most)."""
    if requests in cuts:
        return cuts[requests]
    cut = make()
    if len(cuts) < 4096:
        cuts[requests] = cut
    return cut


class MeasuredPricer:
    """One stack's forwards from the measured tables (the module docstring); the roofline's for what
    they lack, and SpecPV's block selection."""

    def __init__(self, stack: Stack, rates: RooflineRates, tables: OperatorTables, kv_bytes: int,
                 terms: TermOrigins):
        self.stack = stack
        self.rates = rates
        self.roofline = RooflinePricer(stack, rates)
        c = self.c = self.roofline.c
        self.tables = tables
        self._terms = terms
        self.origin = f"measured: {describe(tables)}"
        tp = rates.tp
        act_dtype = TABLE_DTYPE.get(rates.act_bytes)
        weight_dtype = TABLE_DTYPE.get(int(stack.weight_bytes)) if stack.weight_bytes in (1, 2, 4) else None
        if weight_dtype == "fp8" and rates.flops_s == rates.attn_flops_s and rates.act_bytes != 1:
            weight_dtype = None         # fp8 weights without fp8 tensor cores: dequantized, not in the tables
        self.gemm = tables.gemm(weight_dtype) if weight_dtype else None
        self.lm_gemm = tables.gemm(act_dtype) if act_dtype else None
        split = lambda name, i, o: ((i, o) if name in REPLICATED else (i // tp, o) if name in ROW_PARALLEL
                                    else (i, o // tp))
        self.linears = [split(*op) for op in stack.linears] if stack.layers else []
        self.moe_linears = [split(*op) for op in stack.moe_linears] if stack.moe_layers else []
        self.extra_linears = [(i, o // tp) for i, o in stack.extra_linears]
        vocab = stack.lm_head_vocab * stack.lm_head_count
        self.lm_head = (stack.hidden, vocab // tp) if vocab else None
        self.moe = None
        if stack.experts is not None and stack.moe_layers:
            e = stack.experts
            gpus = rates.gpus
            moe_tp, moe_ep = (1, gpus) if rates.expert_parallel else (gpus, 1)
            for dtype in MOE_DTYPES.get(int(stack.weight_bytes), ()) if stack.weight_bytes in (1, 2) else ():
                self.moe = tables.moe(dtype, stack.hidden, e.ffn, e.top_k, e.routed, moe_tp, moe_ep)
                if self.moe is not None:
                    break
        heads, kv_heads = max(stack.heads // tp, 1), max(stack.kv_heads // tp, 1)
        kv_dtype = TABLE_DTYPE.get(kv_bytes)
        self.generation = self.context = self.mla = None
        self.generation_scale = self.context_scale = 1.0
        if stack.latent is not None:
            self.mla = tables.mla_generation(heads, kv_dtype) if kv_dtype else None
        elif kv_dtype and c.attends:
            self.generation = tables.attention("generation_attention_perf", heads, kv_heads, stack.head_dim, kv_dtype)
            self.context = tables.attention("context_attention_perf", heads, kv_heads, stack.head_dim, kv_dtype)
            # Measured at other head counts (the nearest): decode scaled by the KV heads it reads
            # (memory-bound), a prompt by the query heads it computes (compute-bound).
            if self.generation is not None:
                self.generation_scale = kv_heads / self.generation.kv_heads
            if self.context is not None:
                self.context_scale = heads / self.context.heads
        # The decode and verify path's grid (the generation table, or MLA's), its scale and origin.
        if self.generation is None or self.context is None:
            self.generation = self.context = None      # attention from both tables or neither
        self.decode = self.mla if self.mla is not None else (
            self.generation.grid if self.generation is not None else None)
        self.decode_scale = 1.0 if self.mla is not None else self.generation_scale
        self.decode_origin = "measured" if self.mla is not None or (self.generation is not None
                                                                     and self.generation.exact) else "extrapolated"
        self._shared: dict[float, float] = {}
        self._lm_head: dict[float, float] = {}
        # Each weight's GEMM grid cut at its own (k, n) once: a lookup is then one axis, m.
        self.linear_rows = [self.gemm_row(self.gemm, i, o) for i, o in self.linears]
        self.moe_linear_rows = [self.gemm_row(self.gemm, i, o) for i, o in self.moe_linears]
        self._decode_rows: dict[int, DecodeRow | None] = {}
        self._prompt_rows: dict[int, LogGrid | None] = {}
        self._chunks: dict[tuple, float] = {}
        self.window_free = stack.kv_window is None

    def needs_kv_tokens(self, query: int) -> bool:
        return self.stack.kv_window is not None

    def experts_s(self, tokens: float, rank_tokens: float) -> tuple[float, float]:
        """Attention data parallel: the MoE layers' routed experts over every rank's `tokens`, from
        the fused-MoE table (its tokens are all ranks'), and their exchange: (experts, exchange)
        seconds (RooflineRates.experts_time_s)."""
        c = self.c
        return self.rates.experts_time_s(c, tokens, rank_tokens, self.routed_s(tokens) if c.moe_layers else 0.0)

    # -- the batch's shared terms ------------------------------------------------------------

    def gemm_s(self, term: str, grid: LogGrid | None, m: float, n: int, k: int, weight_bytes: float) -> float:
        """One GEMM of m tokens through an (k -> n) weight, measured where the table has it."""
        if grid is None or m <= 0:
            self._terms.add(term, "roofline")
            return self.gemm_roofline_s(m, n, k, weight_bytes)
        seconds, clamped = grid.lookup(k, m, n)
        if clamped is None:
            self._terms.add(term, "measured")
            return seconds
        self._terms.add(term, "extrapolated")
        ck, cm, cn = clamped
        return seconds * self.gemm_roofline_s(m, n, k, weight_bytes) / self.gemm_roofline_s(cm, int(cn), int(ck),
                                                                                          weight_bytes)

    def gemm_roofline_s(self, m: float, n: int, k: int, weight_bytes: float) -> float:
        c, act = self.c, self.rates.act_bytes
        return c.combine(2 * m * n * k / c.flops_s, (n * k * weight_bytes + m * (n + k) * act) / c.bytes_s)

    def linears_s(self, term: str, shapes, tokens: float) -> float:
        """The linears `shapes` ((in, out) as this rank runs them) at `tokens` tokens each."""
        rows = self.linear_rows if shapes is self.linears else self.moe_linear_rows
        total = 0.0
        counts = self._terms.counts.setdefault(term, {})
        for (i, o), row in zip(shapes, rows):
            seconds = row.inside1(tokens) if row is not None and tokens > 0 else None
            if seconds is None:
                total += self.gemm_s(term, self.gemm, tokens, o, i, self.stack.weight_bytes)
            else:
                counts["measured"] = counts.get("measured", 0) + 1
                total += seconds
        return total

    @staticmethod
    def gemm_row(grid: LogGrid | None, k: int, n: int) -> LogGrid | None:
        """A GEMM grid (k, m, n) at one weight's k and n: latency over m, or None outside the grid."""
        plane = grid.section(0, k) if grid is not None else None
        return plane.section(1, n) if plane is not None else None

    def routed_s(self, tokens: float) -> float:
        """One MoE layer's routed experts."""
        if self.moe is None:
            self._terms.add("moe", "roofline")
            return self.c.routed_time_s(tokens)
        seconds, clamped = self.moe.lookup(tokens)
        if clamped is None:
            self._terms.add("moe", "measured")
            return seconds
        self._terms.add("moe", "extrapolated")
        return seconds * self.c.routed_time_s(tokens) / self.c.routed_time_s(clamped[0])

    def batch_terms_s(self, tokens: float, logits: float) -> tuple[float, float]:
        """(shared, LM head) seconds of one forward of `tokens` query tokens and `logits` tokens
        that need logits, each memoized on its own count: a serving run meets the same ones again."""
        shared = self._shared.get(tokens)
        if shared is None:
            shared = self.shared_s(tokens)
            if len(self._shared) < 1 << 16:
                self._shared[tokens] = shared
        if self.lm_head is None or not logits:
            return shared, 0.0
        lm_head = self._lm_head.get(logits)
        if lm_head is None:
            hidden, vocab = self.lm_head
            lm_head = self.gemm_s("lm_head", self.lm_gemm, logits, vocab, hidden, self.rates.act_bytes)
            if len(self._lm_head) < 1 << 16:
                self._lm_head[logits] = lm_head
        return shared, lm_head

    def shared_s(self, tokens: float) -> float:
        """Seconds of the work a forward's `tokens` query tokens share: every layer's linears (and
        routed experts), elementwise work, launches and collectives, and the extra linears."""
        c, engine = self.c, self.rates.engine
        shared = c.dense_layers * self.linears_s("linears", self.linears, tokens)
        if c.moe_layers:
            # With attention data parallel the routed experts see every rank's tokens: the step's (experts_s).
            routed = 0.0 if c.routed_elsewhere else self.routed_s(tokens)
            shared += c.moe_layers * (self.linears_s("linears", self.moe_linears, tokens) + routed)
        layer_overhead = engine.layer_overhead_s
        if engine.graph_max_tokens and tokens > engine.graph_max_tokens:
            layer_overhead += engine.eager_layer_overhead_s
        if c.layers:
            self._terms.add("elementwise", "roofline")
        if self.rates.tp > 1 and c.layers:
            # The engine's measured all-reduce, else a published table's or the guess.
            self._terms.add("all_reduce", getattr(self.rates.collectives, "kind", "roofline"))
        return (shared + c.layers * (c.elementwise_s(tokens) + layer_overhead)
                + self.rates.collectives_time_s(c, tokens)
                + sum(self.gemm_s("extra_linears", self.lm_gemm, tokens, o, i, self.rates.act_bytes)
                      for i, o in self.extra_linears)
                + engine.forward_overhead_s)

    # -- attention ---------------------------------------------------------------------------

    def attention_s(self, requests: int, query: float, kv: float) -> float:
        """One layer's attention for `requests` requests of `query` query tokens each over `kv`
        KV tokens each (the query's own included): the measured row nearest its shape (the module
        docstring). This runs every simulated step: each grid is cut once per request count."""
        c = self.c
        window = self.stack.kv_window
        if window is not None and kv > window:
            kv = window
        if kv < query:
            kv = query
        decode = self.decode
        if decode is None:
            self._terms.add("attention", "roofline")
            return requests * c.request_attention_s(query, kv)
        if query <= c.query_ridge:
            # Decode, and verification while memory-bound (the verify shape): the generation row
            # at the same KV plus the roofline's time of the query tokens past the first.
            row = self.decode_row(requests)
            seconds = row.seconds(query, kv) if row is not None else None
            if seconds is None:
                return self.decode_scale * self.scaled(decode, requests, kv, query, kv, decode_shape, False)
            return seconds
        if self.context is None:        # MLA past the ridge: no measured prompt kernel here
            self._terms.add("attention", "roofline")
            return requests * c.request_attention_s(query, kv)
        # A prompt, a chunk after a cached prefix, a tree past the ridge: the measured regime the
        # roofline adds less to (its time of the asked shape less the measured one's), plus that.
        r = c.request_attention_s
        asked = r(query, kv)
        past_prompt = asked - r(query, query) if kv > query else 0.0
        past_decode = asked - r(1, kv) if kv > query else math.inf
        if abs(past_decode) < abs(past_prompt):
            row = self.decode_row(requests)
            seconds = row.seconds(1, kv, count=False) if row is not None else None
            if seconds is None:
                return self.decode_scale * self.scaled(decode, requests, kv, query, kv, decode_shape, False)
            self._terms.add("attention", "extrapolated")
            return seconds + requests * past_decode
        grid = self.context.grid
        prompt_row = kept(self._prompt_rows, requests, lambda: grid.section(0, requests))
        seconds = prompt_row.inside1(query) if prompt_row is not None else None
        exact = self.context.exact and kv == query
        if seconds is None:
            return self.context_scale * self.scaled(grid, requests, query, query, kv, prompt_shape, exact)
        self._terms.add("attention", "measured" if exact else "extrapolated")
        return self.context_scale * seconds + requests * past_prompt

    def decode_row(self, requests: int) -> DecodeRow | None:
        """The decode grid cut at `requests` (made once), or None outside its batch axis."""
        def make() -> DecodeRow | None:
            cut = self.decode.section(0, requests) if self.decode is not None else None
            return None if cut is None else DecodeRow(cut, self.c.attn_bytes_per_kv, self.c.attn_bytes_per_q,
                                                      self.decode_scale,
                                                      requests * self.c.attn_bytes_per_q / self.c.bytes_s)
        return kept(self._decode_rows, requests, make)

    @property
    def terms(self) -> TermOrigins:
        """Where this stack's terms came from, the decode rows' lookups included."""
        counts = self._terms.counts.setdefault("attention", {}) if self._decode_rows else None
        for row in self._decode_rows.values():
            if row is not None and counts is not None:
                for origin, n in ((self.decode_origin, row.measured), ("extrapolated", row.extrapolated)):
                    if n:
                        counts[origin] = counts.get(origin, 0) + n
                row.measured = row.extrapolated = 0
        return self._terms

    def scaled(self, grid: LogGrid, requests: int, axis: float, query: float, kv: float, shape_at, exact: bool) -> float:
        """grid(requests, axis), whose rows time shape_at(axis) = (query, KV tokens) a request,
        scaled to `requests` x (`query`, `kv`) by the roofline's ratio; beyond the grid, from its
        nearest point. Origin `measured` where `exact` and inside the grid, else `extrapolated`."""
        seconds, clamped = grid.lookup(requests, axis)
        n, a = clamped if clamped is not None else (requests, axis)
        measured = shape_at(a)
        if (n, measured) != (requests, (query, kv)):
            r = self.c.request_attention_s
            seconds *= requests * r(query, kv) / (n * r(*measured))
        self._terms.add("attention", "measured" if exact and clamped is None else "extrapolated")
        return seconds

    def group_attention_s(self, group: Group) -> float:
        """One layer's attention for a group: each request where their KV is listed (prompt chunks),
        else at the mean."""
        if isinstance(group.kv_tokens, (list, tuple)):
            queries = group.query_tokens if group.query_tokens is not None else [group.query_max] * len(group.kv_tokens)
            memo = self._chunks
            total = 0.0
            for pair in zip(queries, group.kv_tokens):
                seconds = memo.get(pair)        # prompt chunks recur: same lengths, same offsets
                if seconds is None:
                    seconds = self.attention_s(1, *pair)
                    if len(memo) < 1 << 16:
                        memo[pair] = seconds
                total += seconds
            return total
        n = max(group.requests, 1)
        return self.attention_s(n, group.tokens / n, group.kv_tokens_sum / n)

    # -- the Pricer protocol -----------------------------------------------------------------

    def forward(self, forward: Forward, shares: list[float]) -> float:
        groups = forward.groups
        tokens, logits = token_counts(groups)
        if tokens == 0:
            return 0.0
        shared, lm_head = self.batch_terms_s(tokens, logits)
        attention_of = self.group_attention_s if self.c.attends else None
        return compose(self.rates, groups, tokens, logits, shared, lm_head, attention_of, self.c, shares,
                       forward.offloaded_layers, forward.kv_offloaded, forward.repeat)

    def forward_uniform(self, forward: UniformForward, shares: list[float]) -> float:
        """`forward` over one group without building it (the hot path); each request's KV only
        where the stack's window clips it or the KV streams over the host link."""
        f = forward
        if f.kv_offloaded or (self.stack.kv_window is not None and f.context is not None):
            return self.forward(f.as_forward(kv_per_request=True), shares)
        tokens = f.requests * f.query if f.tokens is None else f.tokens
        logits = tokens if f.logits_tokens is None else f.logits_tokens
        if tokens == 0:
            return 0.0
        shared, lm_head = self.batch_terms_s(tokens, logits)
        total = shared + lm_head
        requests = f.requests
        if self.c.attends and requests:
            query, kv = tokens / requests, f.kv_tokens_sum / requests
            # Decode and verification's common case straight to its row (attention_s's first branch).
            row = self._decode_rows.get(requests) if self.window_free and query <= self.c.query_ridge else None
            seconds = row.seconds(query, kv if kv > query else query) if row is not None else None
            total += self.c.layers * (seconds if seconds is not None else self.attention_s(requests, query, kv))
        shares[f.phase] += total * f.repeat
        if f.offloaded_layers:
            return with_transfer(self.rates, total, f.offloaded_layers * self.c.layer_weight_bytes
                                 / self.rates.link_bytes_s, shares, f.repeat)
        return total * f.repeat

    def selection(self, selection: Selection, shares: list[float]) -> float:
        self._terms.add("selection", "roofline")
        return self.roofline.selection(selection, shares)

