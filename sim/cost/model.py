"""The cost model: a step's work priced by composition, each term by where its figure comes from.

    CostModel = a pricer per stack (RooflinePricer | TablePricer | BlackBoxPricer | BlackBoxDraftPricer)
              + the engine's host work (RooflineHost: an engine preset | PublishedHost: a published
                host table the preset names | BundleHost: a bundle's fits)

Every pricer answers the same questions of its stack (sim/cost/work.py Pricer; sim/cost/roofline.py
RooflinePricer is the reference): `forward` over groups of requests, `forward_uniform` over one
uniform group (the hot path), `needs_kv_tokens`, SpecPV's `selection`, each asked with a value of
sim/cost/work.py; and says where its figures come from (`origin`).
Without a calibration every stack takes the roofline (datasheet rates x the engine preset's
efficiencies). With one (`calibration: DIR`), a stack the bundle measured takes its operator
tables, or an engine timed whole (a black box: `profiler calibrate --engine ...`); a stack it
cannot price (a draft of other dimensions, EAGLE-3's fusion layer, a Medusa block) keeps the
roofline, and the result's warnings say so. Tensor parallelism and weight offloading are out of a
single-device bundle's reach: tensor_parallel and data_parallel must be 1 (sim/scenario/load.py checks), and
transfers use the measured host-link rate when the bundle has one.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from sim.cost.batch import Group
from sim.cost.blackbox import BlackBoxDraftPricer, BlackBoxPricer
from sim.cost.collectives import all_reduce_ranks
from sim.cost.host import RooflineHost, host_for
from sim.cost.roofline import RooflinePricer, RooflineRates
from sim.cost.stack import Stack, quantized_weight_bytes
from sim.cost.table import BundleHost, TablePricer
from sim.cost.kernels import LayerKernels
from sim.cost.work import Forward, HostWork, Pricer, Selection, UniformForward
from sim.cost.measured import MeasuredPricer
from sim.cost.measured_model import MeasuredAllReduce, TermOrigins, measured_all_to_all, measured_tables_for
from sim.cost.measured_tables import OperatorTables
from sim.errors import InputError
from sim.formats.bundle import Bundle, check_bundle, load_bundle
from sim.formats.published import PublishedProfile, check_kernels, is_published, load_published
from sim.scenario.schema import Scenario


class CostModel:
    """Prices forwards, block selection and host work for one scenario (the module docstring).
    pricer_of(stack): the stack's pricer, asked once per stack, when first priced."""

    def __init__(self, scenario: Scenario, pricer_of: Callable[[Stack], Pricer], host: HostWork,
                 bundle: Bundle | None = None,
                 warnings: list[str] | None = None, collectives=None, all_to_all=None):
        self.scenario = scenario
        self.bundle = bundle
        self.warnings = warnings if warnings is not None else []
        self.collectives = collectives        # the tensor-parallel all-reduce's pricer (sim/cost/collectives.py)
        self.all_to_all = all_to_all          # expert parallelism's dispatch and combine (the same module)
        self._pricer_of = pricer_of
        self._pricers: dict[int, Pricer] = {}
        self.host = host                      # the engine's host work (sim/cost/work.py HostWork)
        self.operator_tables: OperatorTables | None = None   # the measured tables pricing it, if they do

    def pricer(self, stack: Stack) -> Pricer:
        """The stack's pricer (made the first time it is asked for)."""
        p = self._pricers.get(id(stack))
        if p is None:
            p = self._pricers[id(stack)] = self._pricer_of(stack)
        return p

    def origins(self) -> dict[str, str]:
        """Where each term priced so far comes from: per stack, and the engine's host work."""
        origins: dict = {**{p.stack.name: p.origin for p in self._pricers.values()}, "host": self.host.origin}
        if self.collectives is not None and all_reduce_ranks(self.scenario) > 1:
            origins["all_reduce"] = self.collectives.origin
        if self.all_to_all is not None and self.scenario.gpus > 1 and self.scenario.expert_parallel:
            origins["all_to_all"] = self.all_to_all.origin
        terms = {p.stack.name: p.terms.counts for p in self._pricers.values() if hasattr(p, "terms")}
        if terms:
            # Each term's origin (measured, extrapolated, roofline), lookup by lookup (sim/cost/measured.py).
            origins["terms"] = terms
            if self.operator_tables is not None:
                origins["operator_tables"] = self.operator_tables.provenance
        return origins

    def needs_kv_tokens(self, stack: Stack, query: int) -> bool:
        """Does pricing a group of `query`-token requests need each request's KV, not just the sum?"""
        return self.pricer(stack).needs_kv_tokens(query)

    def forward(self, stack: Stack, groups: Sequence[Group], shares: list[float], *, offloaded_layers: int = 0,
                kv_offloaded: bool = False, repeat: int = 1, draft_k: int | None = None) -> float:
        """Seconds of `repeat` identical forwards of `stack` over `groups`; each phase's part goes
        into `shares` (RooflinePricer.forward)."""
        pricer = self.pricer(stack)
        return pricer.forward(Forward(pricer=pricer, groups=groups, offloaded_layers=offloaded_layers,
                                      kv_offloaded=kv_offloaded, repeat=repeat, draft_k=draft_k), shares)

    def forward_uniform(self, stack: Stack, phase: int, requests: int, query: int, kv_tokens_sum: float,
                        shares: list[float], *, tokens: int | None = None, logits_tokens: int | None = None,
                        context: np.ndarray | None = None, kv_offset: float = 0, offloaded_layers: int = 0,
                        kv_offloaded: bool = False, repeat: int = 1, draft_k: int | None = None) -> float:
        """`forward` over one group of requests of `query` tokens each (sim/cost/work.py UniformForward)."""
        pricer = self.pricer(stack)
        return pricer.forward_uniform(UniformForward(
            pricer=pricer, phase=phase, requests=requests, query=query, kv_tokens_sum=kv_tokens_sum, tokens=tokens,
            logits_tokens=logits_tokens, context=context, kv_offset=kv_offset, offloaded_layers=offloaded_layers,
            kv_offloaded=kv_offloaded, repeat=repeat, draft_k=draft_k), shares)

    def selection(self, stack: Stack, requests: int, context_sum: int, query_tokens_sum: int, budget_tokens: int,
                  block_tokens: int, shares: list[float], part: str = "refresh") -> float:
        """SpecPV's block selection in every layer of `stack` (RooflinePricer.selection)."""
        pricer = self.pricer(stack)
        return pricer.selection(Selection(pricer=pricer, requests=requests, context_sum=context_sum,
                                          query_tokens_sum=query_tokens_sum, budget_tokens=budget_tokens,
                                          block_tokens=block_tokens, part=part), shares)


def cost_model_for(scenario: Scenario) -> CostModel:
    """The scenario's cost model: its calibration bundle's, else the measured operator tables'
    where they cover its GPU and engine (`cost`), else the roofline's."""
    if scenario.calibration is None:
        tables, missing = measured_tables_for(scenario)
        if tables is not None:
            return measured_cost_model(scenario, tables)
        rates = RooflineRates(scenario, link_gb_s=scenario.offload.link_gb_s)
        host, host_warnings = host_for(scenario)
        return CostModel(scenario, lambda stack: RooflinePricer(stack, rates), host,
                         warnings=([missing] if missing else []) + list(rates.warnings) + host_warnings,
                         collectives=rates.collectives, all_to_all=rates.all_to_all)
    if scenario.cost == "measured":
        raise InputError("cost", "measured prices from the measured operator tables; a scenario with a calibration "
                                 "is priced by its bundle (use cost: auto)")
    if is_published(scenario.calibration):
        return published_cost_model(scenario, load_published(scenario.calibration))
    return calibrated_cost_model(scenario, load_bundle(scenario.calibration))


def published_cost_model(scenario: Scenario, profile: PublishedProfile) -> CostModel:
    """The roofline with a published profile's layer kernels for every stack of the profile's shape
    (sim/cost/kernels.py): the target, and self-drafts that run its layers."""
    warnings = check_kernels(profile, scenario)
    kernels = LayerKernels(profile, scenario.tensor_parallel, scenario.dtype_bytes)
    rates = RooflineRates(scenario, link_gb_s=scenario.offload.link_gb_s, kernels=kernels)

    def pricer_of(stack: Stack) -> RooflinePricer:
        pricer = RooflinePricer(stack, rates)
        if pricer.c.kernels is not None:
            pricer.origin = kernels.origin
        return pricer

    host, host_warnings = host_for(scenario)
    return CostModel(scenario, pricer_of, host, warnings=warnings + rates.warnings + host_warnings,
                     collectives=rates.collectives, all_to_all=rates.all_to_all)


def calibrated_cost_model(scenario: Scenario, bundle: Bundle) -> CostModel:
    """The scenario priced by `bundle`: each stack by its tables or its engine timed whole where the
    bundle measured it (the roofline, with a warning, where it did not), the host by its fits."""
    warnings = check_bundle(bundle, scenario)
    link_gb_s = scenario.offload.link_gb_s
    h2d = bundle.table("h2d_pinned")
    if link_gb_s is None and h2d is not None:
        largest = float(h2d.axes[0][-1])
        link_gb_s = largest / h2d(largest) / 1e9
    rates = RooflineRates(scenario, link_gb_s=link_gb_s)
    model = scenario.model_spec
    spec = scenario.speculation
    shadow_bytes = quantized_weight_bytes(spec.draft.bits, spec.draft.group_size)

    def pricer_of(stack: Stack):
        roofline = RooflinePricer(stack, rates)
        same_shape = (stack.hidden, stack.heads, stack.kv_heads, stack.head_dim, stack.ffn) == \
            (model.hidden, model.heads, model.kv_heads, model.head_dim, model.ffn) and stack.experts is None \
            and stack.latent is None
        if bundle.table("engine_forward") is not None:
            # A black box timed the engine's target in the bundle's dtype, which check_bundle has
            # matched to the scenario's: its weights are whatever that engine serves (llama.cpp's
            # Q4_1 GGUF: int4), not the operator tables' activation-width linears.
            if same_shape and stack.name == "target" and stack.layers == model.layers:
                return BlackBoxPricer(stack, bundle, roofline)
            if stack.name == "eagle" and bundle.table("engine_draft") is not None and spec.tree is None:
                return BlackBoxDraftPricer(stack, bundle, roofline, spec.num_speculative_tokens)
            warnings.append(f"stack {stack.name} priced by the roofline model (the bundle times "
                            f"{bundle.meta.get('engine')} forwards of the target"
                            f"{' and an EAGLE head, in chains' if bundle.table('engine_draft') else ''} only)")
            roofline.origin = f"roofline (the bundle times {bundle.meta.get('engine')} forwards of the target only)"
            return roofline
        prefix = "linear"
        if stack.weight_bytes != rates.act_bytes:
            prefix = f"int{spec.draft.bits}"
            if stack.name != "shadow" or stack.weight_bytes != shadow_bytes:
                same_shape = False
        lm_head = stack.lm_head_vocab in (0, model.vocab)
        needed = [f"{prefix}.{n}" for n, _, _ in stack.linears] if stack.layers else []
        needed += ["elementwise", "attention", "attention_prefill"] + (["lm_head"] if lm_head and stack.lm_head_vocab else [])
        missing = [n for n in needed if bundle.table(n) is None]
        if not same_shape or missing:
            reason = "other dimensions" if not same_shape else f"no {', '.join(missing)} in the bundle"
            warnings.append(f"stack {stack.name} priced by the roofline model ({reason})")
            roofline.origin = f"roofline ({reason})"
            return roofline
        partly = (["its extra linears"] if stack.extra_linears else []) + \
            ([f"its LM head (vocabulary {stack.lm_head_vocab})"] if not lm_head else [])
        pricer = TablePricer(stack, rates, bundle, prefix, lm_head)
        if partly:
            warnings.append(f"stack {stack.name}: {' and '.join(partly)} priced by the roofline model "
                            f"(not in the bundle)")
            pricer.origin += f" ({' and '.join(partly)} by the roofline)"
        return pricer

    return CostModel(scenario, pricer_of, BundleHost(bundle, RooflineHost(scenario.engine_spec)), bundle, warnings)


def measured_cost_model(scenario: Scenario, tables: OperatorTables) -> CostModel:
    """Every stack priced by the measured tables (sim/cost/measured.py), the all-reduce by the
    engine's measured one where the tables hold the GPU count, expert parallelism's all-to-all by
    DeepEP's measured kernels where they timed it, the host by the engine preset."""
    all_reduce = None
    # The table times one GPU count: not where the step also gathers every rank's tokens over all
    # the GPUs (attention data parallel with the experts split).
    if 1 < all_reduce_ranks(scenario) == scenario.tensor_parallel:
        grid = tables.all_reduce(scenario.tensor_parallel)
        if grid is not None:
            all_reduce = MeasuredAllReduce(grid, tables)
    rates = RooflineRates(scenario, link_gb_s=scenario.offload.link_gb_s, all_reduce=all_reduce,
                          # The engine's named all-to-all table first: the user chose it.
                          all_to_all=None if scenario.engine_spec.all_to_all else measured_all_to_all(scenario, tables))
    terms: dict[str, TermOrigins] = {}

    def pricer_of(stack: Stack) -> MeasuredPricer:
        return MeasuredPricer(stack, rates, tables, scenario.kv_bytes, terms.setdefault(stack.name, TermOrigins()))

    host, host_warnings = host_for(scenario)
    model = CostModel(scenario, pricer_of, host, warnings=list(rates.warnings) + host_warnings,
                      collectives=rates.collectives, all_to_all=rates.all_to_all)
    model.operator_tables = tables
    return model
