"""A stack priced by a calibration bundle's operator tables, and the engine's host work by its fits.

A forward is composed exactly as the roofline composes it (sim/cost/compose.py):
per decoder layer the four linears and the elementwise work on the batch's query tokens plus each
group's attention, then the LM head on the tokens that need logits, plus the forward's shared
inputs (embedding, mask, rotations). A whole forward runs slower than its operators timed one by
one (Python between operators, threads of the matmul library sleeping between them, every layer's
weights and KV streamed back to back), by a factor that depends on the forward's query tokens and
the KV it reads, so the bundle also carries that factor, measured on whole forwards, and every
forward is multiplied by it. Only the source of each term changes: an OperatorTable measured by
`python -m profiler calibrate` (sim/formats/bundle.py) instead of FLOPs and bytes over datasheet
rates, and fitted host terms of the live engine instead of an engine preset's.

Attention of a group of requests reads the table at (requests, query tokens per request, mean KV
tokens); queries longer than the table's are priced per request: a whole prompt from the prompt
table (SDPA's causal kernel, as the engine's prefill runs), a chunk after a cached prefix from the
prefill table (masked); SpecPV's partial groups read the partial-attention table (selected
positions gathered).
"""
from __future__ import annotations

from typing import cast

import numpy as np

from sim.cost.batch import DRAFT, OVERHEAD, PARTIAL, SELECTION, Group
from sim.cost.coefficients import LinearCost
from sim.cost.compose import compose, token_counts
from sim.cost.host import RooflineHost
from sim.cost.roofline import RooflinePricer, RooflineRates
from sim.cost.stack import Stack
from sim.cost.work import Forward, Selection, UniformForward
from sim.formats.bundle import Bundle
from sim.formats.provenance import repo_relative


class TablePricer:
    """One stack's forwards from the bundle's tables: per-layer linears + elementwise, LM head,
    attention (the module docstring); the roofline's for what the bundle lacks (its extra linears,
    an LM head of another vocabulary, host-link transfers)."""

    def __init__(self, stack: Stack, rates: RooflineRates, bundle: Bundle, prefix: str, lm_head: bool):
        self.stack = stack
        self.rates = rates
        self.roofline = RooflinePricer(stack, rates)     # what the tables do not time, and selection without them
        roofline = self.roofline.c
        self.bundle = bundle
        self.origin = f"operator tables of {repo_relative(bundle.path)}"
        self.layers = stack.layers
        self.attends = stack.attention and stack.layers > 0
        self.attn_bytes_per_kv = roofline.attn_bytes_per_kv
        self.layer_weight_bytes = roofline.layer_weight_bytes
        # The tables the cost model checked the bundle has (sim/cost/model.py calibrated_cost_model).
        self.linears = [bundle.tables[f"{prefix}.{name}"] for name, _, _ in stack.linears] if stack.layers else []
        self.elementwise = bundle.tables["elementwise"]
        self.lm_head = bundle.table("lm_head") if lm_head else None
        self.attention = bundle.tables["attention"]
        self.prefill = bundle.tables["attention_prefill"]
        self.prompt = bundle.table("attention_prompt")      # bundles before it price prompts masked
        self.partial = bundle.table("attention_partial")
        self.query_max = float(self.attention.axes[1][-1])
        self.forward_base = bundle.table("forward_base")
        self.forward_factor = bundle.forward_factor()
        self.selection_factor = bundle.selection_factor()
        self._batch: dict[tuple, tuple[float, float]] = {}

    def needs_kv_tokens(self, query: int) -> bool:
        return self.stack.kv_window is not None

    def forward(self, forward: Forward, shares: list[float]) -> float:
        groups = forward.groups
        tokens, logits = token_counts(groups)
        if tokens == 0:
            return 0.0
        requests = sum(g.requests for g in groups)
        kv_mean = sum(g.kv_tokens_sum for g in groups) / max(requests, 1)
        base = self.forward_base(requests, tokens / max(requests, 1), kv_mean) if self.forward_base else 0.0
        shared, lm_head = self.batch_terms_s(tokens, logits)
        # Whole forwards measured against composed ones, at this many query tokens.
        scale = self.forward_factor(tokens, kv_mean) if self.forward_factor is not None else 1.0
        shared = (shared + base) * scale
        attention_of = (lambda g: self.attention_layer_s(g) * scale) if self.attends else None
        return compose(self.rates, groups, tokens, logits, shared, lm_head * scale, attention_of, self, shares,
                       forward.offloaded_layers, forward.kv_offloaded, forward.repeat)

    def forward_uniform(self, forward: UniformForward, shares: list[float]) -> float:
        # Each request's KV only where the stack's KV window clips it.
        return self.forward(forward.as_forward(kv_per_request=self.stack.kv_window is not None), shares)

    def batch_terms_s(self, tokens: float, logits: float) -> tuple[float, float]:
        """(layers, LM head) seconds of one forward of `tokens` query tokens, memoized."""
        key = (tokens, logits)
        terms = self._batch.get(key)
        if terms is None:
            per_layer = sum(t(tokens) for t in self.linears) + self.elementwise(tokens) if self.layers else 0.0
            shared = self.layers * per_layer
            if self.stack.extra_linears:
                shared += self.roofline.c.linear_time_s(self.roofline.c.extra_linears, tokens)
            if not logits:
                lm = 0.0
            elif self.lm_head is not None:
                lm = self.lm_head(logits * self.stack.lm_head_count)
            else:   # an LM head of another vocabulary than the bundle's, which the roofline has
                lm = self.roofline.c.linear_time_s([cast(LinearCost, self.roofline.c.lm_head)], logits)
            terms = (shared, lm)
            if len(self._batch) < 1 << 16:
                self._batch[key] = terms
        return terms

    def attention_layer_s(self, group: Group) -> float:
        """One layer's attention for a group."""
        window = self.stack.kv_window
        if isinstance(group.kv_tokens, (list, tuple)):      # prompt chunks: each request on its own
            queries = group.query_tokens if group.query_tokens is not None else [group.query_max] * len(group.kv_tokens)
            return sum(self.request_s(q, min(kv, window) if window else kv) for q, kv in zip(queries, group.kv_tokens))
        n = max(group.requests, 1)
        if group.kv_tokens is not None and window is not None:
            kv_mean = float(np.minimum(group.kv_tokens, window).mean())
        else:
            kv_mean = group.kv_tokens_sum / n
            if window is not None:
                kv_mean = min(kv_mean, window)
        q = group.tokens / n
        if group.phase == PARTIAL and self.partial is not None:
            return self.partial(n, q, kv_mean)
        if q <= self.query_max:
            return self.attention(n, q, max(kv_mean, q))
        return n * self.long_query_s(q, kv_mean)

    def request_s(self, query: float, kv: float) -> float:
        if query <= self.query_max:
            return self.attention(1, query, max(kv, query))
        return self.long_query_s(query, kv)

    def long_query_s(self, query: float, kv: float) -> float:
        """A whole prompt (KV no longer than the query, full attention) takes the engine's causal
        prompt path; a chunk after a cached prefix the masked one."""
        if self.prompt is not None and kv <= query and self.stack.kv_window is None:
            return self.prompt(query)
        return self.prefill(query, max(kv, query))

    def selection(self, selection: Selection, shares: list[float]) -> float:
        return select_from_tables(self.bundle, self.forward_factor, self.selection_factor, self.roofline, selection,
                                  shares)


def select_from_tables(bundle: Bundle, forward_factor, selection_factor, roofline: RooflinePricer,
                       selection: Selection, shares: list[float]) -> float:
    """Block summaries of the context and/or one selection, in every layer (the measured ops):
    part "refresh" both, "summaries" or "scores" one of them (see RooflinePricer.selection); the
    roofline's where the bundle lacks the tables."""
    summaries, select = bundle.table("summaries"), bundle.table("selection")
    requests, part = selection.requests, selection.part
    if requests == 0:
        return 0.0
    if summaries is None or select is None:
        return roofline.selection(selection, shares)
    context = selection.context_sum / requests
    query_tokens_sum, budget_tokens = selection.query_tokens_sum, selection.budget_tokens
    # Both run amid the engine's other work, slower than alone: the summaries (a loop over the
    # layers after a full verification) by the whole-forward factor; the selection, some twenty
    # small operators between a layer's matmuls, by its own factor measured inside
    # partial-verification forwards where the bundle has one.
    forward_scale = forward_factor(query_tokens_sum, context) if forward_factor is not None else 1.0
    select_scale = selection_factor(requests, context) if selection_factor is not None else forward_scale
    per_layer = ((summaries(requests, context) * forward_scale if part != "scores" else 0.0)
                 + (select(requests, context, budget_tokens) * select_scale if part != "summaries" else 0.0))
    seconds = roofline.stack.layers * per_layer
    shares[SELECTION] += seconds
    return seconds


class BundleHost:
    """The live engine's host work as the bundle measured it: each step's (fitted, fixed and per
    request) plus its acceptance of the batch's logits, prompt lookup's (the measured lookup at the
    mean context), and nothing for speculation beyond it (the fitted step time and the acceptance
    table already hold the measured engine's speculative host work)."""

    def __init__(self, bundle: Bundle, preset: RooflineHost):
        fits = bundle.fits
        self.preset = preset                     # prompt lookup where the bundle did not time it
        self.origin = f"fits of {repo_relative(bundle.path)}"
        self.step_fixed_s = float(fits.get("step_overhead_s", 0.0))
        self.step_per_request_s = float(fits.get("request_overhead_s", 0.0))
        self.accept = bundle.table("accept")
        self.ngram = bundle.table("ngram")
        self.host_work_in_steps = bool(fits.get("host_work_in_steps"))

    def host_draft(self, requests: int, shares: list[float], context_tokens: float | None = None) -> float:
        """Prompt lookup for each request over its history; nothing where the bundle's steps were
        timed with the drafter inside them (vLLM's server)."""
        if self.host_work_in_steps:
            return 0.0
        if self.ngram is None or context_tokens is None:
            return self.preset.host_draft(requests, shares)
        seconds = requests * self.ngram(context_tokens)
        shares[DRAFT] += seconds
        return seconds

    def speculation_overhead(self, requests: int, draft_forwards: int, shares: list[float]) -> float:
        return 0.0

    def step_overhead(self, requests: int, shares: list[float], verify_tokens: int = 1) -> float:
        """The live engine's host time per step (fitted) plus its acceptance of the batch's logits,
        `verify_tokens` per request (1: a plain decode step, whose fit excluded the same term)."""
        seconds = self.step_fixed_s + self.step_per_request_s * requests
        if self.accept is not None and requests:
            seconds += self.accept(requests, verify_tokens)
        shares[OVERHEAD] += seconds
        return seconds
