"""The calibrated cost model: the roofline's composition with measured operator times.

A forward is composed exactly as in sim/cost/roofline.py: per decoder layer the four linears and
the elementwise work on the batch's query tokens plus each group's attention, then the LM head on
the tokens that need logits, plus the forward's shared inputs (embedding, mask, rotations); a step
adds the engine's host overhead. A whole forward runs slower than its operators timed one by one
(Python between operators, threads of the matmul library sleeping between them, every layer's
weights and KV streamed back to back), by a factor that depends on the forward's query tokens and
the KV it reads, so the bundle also carries that factor, measured on whole forwards, and every
forward is multiplied by it. Only the source of each term changes: an OperatorTable measured by `python -m profiler
calibrate` (sim/formats/bundle.py) instead of FLOPs and bytes over datasheet rates, and fitted
overheads of the live engine instead of an engine preset's.

Attention of a group of requests reads the table at (requests, query tokens per request, mean KV
tokens); queries longer than the table's are priced per request: a whole prompt from the prompt
table (SDPA's causal kernel, as the engine's prefill runs), a chunk after a cached prefix from the
prefill table (masked); SpecPV's partial groups read the partial-attention table (selected positions gathered). A stack the bundle did not measure (a draft model or head of other dimensions, EAGLE-3's
fusion layer, a Medusa block) keeps the roofline price, and the result says so in its warnings.
Tensor parallelism and weight offloading are out of a single-device bundle's reach: tensor_parallel
must be 1 (sim/scenario/schema.py checks), and transfers use the measured host-link rate when the bundle has one.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sim.cost.batch import DRAFT, OVERHEAD, PARTIAL, PREFILL, SELECTION, Group
from sim.formats.bundle import Bundle, check_bundle, load_bundle
from sim.cost.roofline import RooflineCostModel
from sim.cost.stack import Stack, quantized_weight_bytes
from sim.scenario.schema import Scenario


def cost_model_for(scenario: Scenario):
    """The scenario's cost model: calibrated when it names a bundle, roofline otherwise."""
    if scenario.calibration is None:
        return RooflineCostModel(scenario, link_gb_s=scenario.offload.link_gb_s)
    return CalibratedCostModel(scenario, load_bundle(scenario.calibration))


class _Priced:
    """One stack's measured terms: per-layer linears + elementwise, LM head, attention."""

    def __init__(self, stack: Stack, roofline, bundle: Bundle, prefix: str, lm_head: bool):
        self.stack = stack
        self.roofline = roofline                 # the roofline's _StackCost: transfers, extra linears
        self.layers = stack.layers
        self.attends = stack.attention and stack.layers > 0
        self.attn_bytes_per_kv = roofline.attn_bytes_per_kv
        self.layer_weight_bytes = roofline.layer_weight_bytes
        self.linears = [bundle.table(f"{prefix}.{name}") for name, _, _ in stack.linears] if stack.layers else []
        self.elementwise = bundle.table("elementwise")
        self.lm_head = bundle.table("lm_head") if lm_head else None
        self.attention = bundle.table("attention")
        self.prefill = bundle.table("attention_prefill")
        self.prompt = bundle.table("attention_prompt")      # bundles before it price prompts masked
        self.partial = bundle.table("attention_partial")
        self.query_max = float(self.attention.axes[1][-1])
        self._batch: dict[tuple, tuple[float, float]] = {}

    def batch_terms_s(self, tokens: float, logits: float) -> tuple[float, float]:
        """(layers, LM head) seconds of one forward of `tokens` query tokens, memoized."""
        key = (tokens, logits)
        terms = self._batch.get(key)
        if terms is None:
            per_layer = sum(t(tokens) for t in self.linears) + self.elementwise(tokens) if self.layers else 0.0
            shared = self.layers * per_layer
            if self.stack.extra_linears:
                shared += self.roofline.linear_time_s(self.roofline.extra_linears, tokens)
            if not logits:
                lm = 0.0
            elif self.lm_head is not None:
                lm = self.lm_head(logits * self.stack.lm_head_count)
            else:
                lm = self.roofline.linear_time_s([self.roofline.lm_head], logits)
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


class _BlackBox:
    """A target priced by whole forwards of an engine timed from outside (`profiler calibrate
    --engine hf`): engine_forward (requests, query tokens, KV tokens) and engine_prefill
    (requests, prompt tokens); nothing inside a forward is known."""

    def __init__(self, bundle: Bundle):
        self.forward = bundle.table("engine_forward")
        self.prefill = bundle.table("engine_prefill")
        self.query_max = float(self.forward.axes[1][-1])
        # Every measured point is a whole step of its own, so each holds the step's fixed cost (the
        # weights read, the host's step work); the cheapest step measured is taken as that cost.
        self.fixed_s = float(self.forward(1, 1, float(self.forward.axes[2][0])))

    def step_s(self, groups: Sequence[Group]) -> tuple[float, list[float]]:
        """A step of these groups and each group's own time: a continuous-batching engine runs them
        as one forward, which pays the step's fixed cost once, not once a group (never less than
        its costliest group)."""
        own = [self.group_s(g) if g.tokens else 0.0 for g in groups]
        parts = sum(1 for g in groups if g.tokens)
        return max(sum(own) - (parts - 1) * self.fixed_s, max(own, default=0.0)), own

    def group_s(self, group: Group) -> float:
        n = max(group.requests, 1)
        q = group.tokens / n
        kv = group.kv_tokens_sum / n
        if group.phase == PREFILL or q > self.query_max:
            return self.prefill(n, q)
        return self.forward(n, q, max(kv, q))


class _BlackBoxDraft:
    """An EAGLE head priced by the drafting an engine's steps add, timed from outside (`profiler
    calibrate --engine vllm --head DIR`): engine_draft (requests, query tokens verified, KV tokens),
    a step's whole drafting of query - 1 tokens, and engine_draft_prefill (requests, prompt tokens),
    the head's part of a prompt's first token. A chain of k drafts runs k head forwards a step (the
    catch-up that gives the first draft, then one a draft), each priced a k-th of the step's."""

    def __init__(self, bundle: Bundle, k: int):
        self.draft = bundle.table("engine_draft")
        self.prefill = bundle.table("engine_draft_prefill")
        self.k = k

    def step_s(self, groups: Sequence[Group]) -> tuple[float, list[float]]:
        own = [self.group_s(g) if g.tokens else 0.0 for g in groups]
        return sum(own), own

    def group_s(self, group: Group) -> float:
        n = max(group.requests, 1)
        if group.phase == PREFILL:
            return self.prefill(n, group.tokens / n)
        kv = group.kv_tokens_sum / n
        return self.draft(n, self.k + 1, kv) / self.k


class CalibratedCostModel(RooflineCostModel):
    """RooflineCostModel's interface with measured terms (see the module docstring)."""

    def __init__(self, scenario: Scenario, bundle: Bundle):
        self.scenario = scenario          # load_scenario has refused tensor_parallel > 1 with a bundle
        self.bundle = bundle
        self.warnings = check_bundle(bundle, scenario)
        link_gb_s = scenario.offload.link_gb_s
        h2d = bundle.table("h2d_pinned")
        if link_gb_s is None and h2d is not None:
            largest = float(h2d.axes[0][-1])
            link_gb_s = largest / h2d(largest) / 1e9
        super().__init__(scenario, link_gb_s=link_gb_s)
        fits = bundle.fits
        self.forward_base = bundle.table("forward_base")
        self.forward_factor = bundle.forward_factor()
        self.selection_factor = bundle.selection_factor()
        self.step_fixed_s = float(fits.get("step_overhead_s", 0.0))
        self.step_per_request_s = float(fits.get("request_overhead_s", 0.0))
        self.model = scenario.model_spec
        self.shadow_bits = scenario.speculation.draft.bits
        self.shadow_bytes = quantized_weight_bytes(scenario.speculation.draft.bits, scenario.speculation.draft.group_size)
        self._priced: dict[int, _Priced | None] = {}

    def priced(self, stack: Stack) -> _Priced | None:
        """The stack's measured terms, or None when the bundle cannot price it (roofline then)."""
        key = id(stack)
        if key not in self._priced:
            self._priced[key] = self._price(stack)
        return self._priced[key]

    def _price(self, stack: Stack) -> _Priced | None:
        m = self.model
        same_shape = (stack.hidden, stack.heads, stack.kv_heads, stack.head_dim, stack.ffn) == \
            (m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn) and stack.experts is None and stack.latent is None
        if self.bundle.table("engine_forward") is not None:
            # A black box timed the engine's target in the bundle's dtype, which check_bundle has
            # matched to the scenario's: its weights are whatever that engine serves (llama.cpp's
            # Q4_1 GGUF: int4), not the operator tables' activation-width linears.
            if same_shape and stack.name == "target" and stack.layers == m.layers:
                return _BlackBox(self.bundle)
            spec = self.scenario.speculation
            if stack.name == "eagle" and self.bundle.table("engine_draft") is not None and spec.tree is None:
                return _BlackBoxDraft(self.bundle, spec.num_speculative_tokens)
            self.warnings.append(f"stack {stack.name} priced by the roofline model (the bundle times "
                                 f"{self.bundle.meta.get('engine')} forwards of the target"
                                 f"{' and an EAGLE head, in chains' if self.bundle.table('engine_draft') else ''} only)")
            return None
        prefix = "linear"
        if stack.weight_bytes != self.act_bytes:
            prefix = f"int{self.shadow_bits}"
            if stack.name != "shadow" or stack.weight_bytes != self.shadow_bytes:
                same_shape = False
        lm_head = stack.lm_head_vocab in (0, m.vocab)
        needed = [f"{prefix}.{n}" for n, _, _ in stack.linears] if stack.layers else []
        needed += ["elementwise", "attention", "attention_prefill"] + (["lm_head"] if lm_head and stack.lm_head_vocab else [])
        missing = [n for n in needed if self.bundle.table(n) is None]
        if not same_shape or missing:
            reason = "other dimensions" if not same_shape else f"no {', '.join(missing)} in the bundle"
            self.warnings.append(f"stack {stack.name} priced by the roofline model ({reason})")
            return None
        partly = (["its extra linears"] if stack.extra_linears else []) + \
            ([f"its LM head (vocabulary {stack.lm_head_vocab})"] if not lm_head else [])
        if partly:
            self.warnings.append(f"stack {stack.name}: {' and '.join(partly)} priced by the roofline model "
                                 f"(not in the bundle)")
        return _Priced(stack, self._cost_of(stack), self.bundle, prefix, lm_head)

    def needs_kv_tokens(self, stack: Stack, query: int) -> bool:
        if isinstance(self.priced(stack), (_BlackBox, _BlackBoxDraft)):
            return False
        if self.priced(stack) is None:
            return super().needs_kv_tokens(stack, query)
        return stack.kv_window is not None

    def forward(self, stack: Stack, groups: Sequence[Group], shares: list[float], *,
                offloaded_layers: int = 0, kv_offloaded: bool = False, repeat: int = 1) -> float:
        p = self.priced(stack)
        if p is None:
            return super().forward(stack, groups, shares, offloaded_layers=offloaded_layers,
                                   kv_offloaded=kv_offloaded, repeat=repeat)
        if isinstance(p, (_BlackBox, _BlackBoxDraft)):
            seconds, own = p.step_s(groups)
            total = sum(own)
            for g, part in zip(groups, own):
                if part:
                    shares[g.phase] += part * seconds / total * repeat
            return seconds * repeat
        tokens = sum(g.tokens for g in groups)
        logits = sum(g.logits_tokens for g in groups)
        if tokens == 0:
            return 0.0
        requests = sum(g.requests for g in groups)
        kv_mean = sum(g.kv_tokens_sum for g in groups) / max(requests, 1)
        base = self.forward_base(requests, tokens / max(requests, 1), kv_mean) if self.forward_base else 0.0
        shared, lm_head = p.batch_terms_s(tokens, logits)
        # Whole forwards measured against composed ones, at this many query tokens.
        scale = self.forward_factor(tokens, kv_mean) if self.forward_factor is not None else 1.0
        shared = (shared + base) * scale
        attention_of = (lambda g: p.attention_layer_s(g) * scale) if p.attends else None
        return self.compose(groups, tokens, logits, shared, lm_head * scale, attention_of, p, shares,
                            offloaded_layers, kv_offloaded, repeat)

    def forward_uniform(self, stack: Stack, phase: int, requests: int, query: int, kv_tokens_sum: float,
                        shares: list[float], *, tokens: int | None = None, logits_tokens: int | None = None,
                        context: np.ndarray | None = None, kv_offset: float = 0, offloaded_layers: int = 0,
                        kv_offloaded: bool = False, repeat: int = 1) -> float:
        if self.priced(stack) is None:
            return super().forward_uniform(stack, phase, requests, query, kv_tokens_sum, shares, tokens=tokens,
                                           logits_tokens=logits_tokens, context=context, kv_offset=kv_offset,
                                           offloaded_layers=offloaded_layers, kv_offloaded=kv_offloaded,
                                           repeat=repeat)
        if tokens is None:
            tokens = requests * query
        if logits_tokens is None:
            logits_tokens = tokens
        kv = context + kv_offset if context is not None and stack.kv_window is not None else None
        group = Group(phase, requests, tokens, query, kv_tokens_sum, logits_tokens, None, kv)
        return self.forward(stack, [group], shares, offloaded_layers=offloaded_layers, kv_offloaded=kv_offloaded,
                            repeat=repeat)

    def selection(self, stack: Stack, requests: int, context_sum: int, query_tokens_sum: int,
                  budget_tokens: int, block_tokens: int, shares: list[float], part: str = "refresh") -> float:
        """Block summaries of the context and/or one selection, in every layer (the measured ops):
        part "refresh" both, "summaries" or "scores" one of them (see RooflineCostModel.selection)."""
        summaries, select = self.bundle.table("summaries"), self.bundle.table("selection")
        if requests == 0:
            return 0.0
        if summaries is None or select is None or self.priced(stack) is None:
            return super().selection(stack, requests, context_sum, query_tokens_sum, budget_tokens, block_tokens,
                                     shares, part)
        context = context_sum / requests
        # Both run amid the engine's other work, slower than alone: the summaries (a loop over the
        # layers after a full verification) by the whole-forward factor; the selection, some twenty
        # small operators between a layer's matmuls, by its own factor measured inside
        # partial-verification forwards where the bundle has one.
        forward_scale = self.forward_factor(query_tokens_sum, context) if self.forward_factor is not None else 1.0
        select_scale = self.selection_factor(requests, context) if self.selection_factor is not None else forward_scale
        per_layer = ((summaries(requests, context) * forward_scale if part != "scores" else 0.0)
                     + (select(requests, context, budget_tokens) * select_scale if part != "summaries" else 0.0))
        seconds = stack.layers * per_layer
        shares[SELECTION] += seconds
        return seconds

    def host_draft(self, requests: int, shares: list[float], context_tokens: float | None = None) -> float:
        """Prompt lookup for each request over its history (the measured lookup at the mean context);
        nothing where the bundle's steps were timed with the drafter inside them (vLLM's server)."""
        if self.bundle.fits.get("host_work_in_steps"):
            return 0.0
        ngram = self.bundle.table("ngram")
        if ngram is None or context_tokens is None:
            return super().host_draft(requests, shares)
        seconds = requests * ngram(context_tokens)
        shares[DRAFT] += seconds
        return seconds

    def speculation_overhead(self, requests: int, draft_forwards: int, shares: list[float]) -> float:
        """Nothing beyond step_overhead: the bundle's fitted step time and its acceptance table
        already hold the measured engine's speculative host work."""
        return 0.0

    def step_overhead(self, requests: int, shares: list[float], verify_tokens: int = 1) -> float:
        """The live engine's host time per step (fitted) plus its acceptance of the batch's logits,
        `verify_tokens` per request (1: a plain decode step, whose fit excluded the same term)."""
        seconds = self.step_fixed_s + self.step_per_request_s * requests
        accept = self.bundle.table("accept")
        if accept is not None and requests:
            seconds += accept(requests, verify_tokens)
        shares[OVERHEAD] += seconds
        return seconds
