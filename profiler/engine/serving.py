"""Serving on the torch Llama: requests arrive, wait, are admitted, prefill and decode, and leave.

Continuous batching (the default), as the simulator's engine (sim/pipeline.py) runs it: an
iteration
  1. takes in the requests that have arrived (a closed loop's next request arrives when one of its
     clients' requests finishes; an open loop's at its given time, Poisson or a trace);
  2. admits waiting requests, oldest first, while a cache row is free and the KV budget (each
     admitted request's prompt + max_new_tokens, reserved) allows;
  3. prefills up to `prefill_chunk` prompt tokens, oldest request first, each request's piece in
     its own cache row (one forward per request; a prompt may take several iterations);
  4. runs one speculative step (profiler.engine.speculative.run_step) for the requests decoding;
  5. lets the requests that finished leave, and those whose prompt completed in 3 join the decoding
     requests with their first token: an iteration's outputs come out together, at its end.
Decoding requests sit in cache rows 0..n-1, so a step reads a slice of the cache (no copy); a
request leaving swaps the last decoding row into its place, and one joining swaps into row n
(each swap copies the two rows' filled slots). Prefilling requests take the highest free rows.

Static batching (`static`): a batch is admitted only when the engine is empty (up to max_batch
requests), prefilled in one forward, and decoded until its last request finishes; its finished
requests leave the step they finish (`speculative_generate` runs one such batch).

The engine runs in real time: an open loop's requests arrive on the wall clock, and an engine with
nothing to do sleeps until the next arrival.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

import spec_kernels
from profiler.engine.drafters import Drafter
from profiler.engine.graphs import disable_graphs, enable_graphs
from profiler.engine.model import Llama
from profiler.engine.partial import PartialSpec
from profiler.engine.speculative import (Generation, RequestState, Sampler, device_sync, output_complete, refeed_room,
                                         run_step)
from profiler.engine.tree import TreeShape
from sim.policy import SpeculationPolicy

if TYPE_CHECKING:
    from sim.step_price import DecodeStepPricer


@dataclass(frozen=True)
class ServeSpec:
    """How requests reach the engine and how it schedules them."""
    max_batch: int                           # cache rows: requests prefilling or decoding at once
    prefill_chunk: int = 512                 # prompt tokens prefilled per iteration (continuous)
    kv_budget_tokens: int | None = None      # admission reserves prompt + max_new_tokens; None: rows only
    static: bool = False                     # static batches instead of continuous batching
    concurrency: int | None = None           # closed loop: clients each sending a request when its last finished
    arrival_s: tuple[float, ...] | None = None   # open loop: request i arrives at arrival_s[i] (sorted)

    def check(self, requests: int) -> None:
        if self.max_batch < 1 or self.prefill_chunk < 1:
            raise ValueError("max_batch and prefill_chunk must be >= 1")
        if (self.concurrency is None) == (self.arrival_s is None):
            raise ValueError("give a closed loop's concurrency or an open loop's arrival times, not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.arrival_s is not None:
            if len(self.arrival_s) != requests:
                raise ValueError(f"{len(self.arrival_s)} arrival times for {requests} requests")
            if any(b < a for a, b in zip(self.arrival_s, self.arrival_s[1:])) or self.arrival_s[0] < 0:
                raise ValueError("arrival times must be >= 0 and sorted")


@dataclass
class Served(Generation):
    """A Generation with each request's way through the server (seconds since the run's start)."""
    arrival_s: list[float] = field(default_factory=list)
    admitted_s: list[float] = field(default_factory=list)
    prefill_chunks: list[tuple[int, int, int, float]] = field(default_factory=list)   # (iteration, request, tokens, s)
    cuda_graphs: bool = False                # decode / verify / chain-draft forwards replayed from CUDA graphs
    graph_captures: int = 0                  # graphs captured during this run, and their seconds
    graph_capture_s: float = 0.0
    kernel_variants: int = 0                 # Triton kernel variants first launched in this run (GPU: compiles)


@dataclass
class _Prefilling:
    state: RequestState             # history = the prompt until its first token
    row: int
    done: int = 0                   # prompt tokens in the cache


def poisson_arrivals(requests: int, rate_per_s: float, seed: int) -> tuple[float, ...]:
    """Arrival times of a Poisson process at `rate_per_s`, the first at 0 (numpy, seeded)."""
    import numpy as np

    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, requests)
    gaps[0] = 0.0
    return tuple(float(t) for t in np.cumsum(gaps))


def speculative_generate(model: Llama, prompts: list[list[int]], max_new_tokens: int, drafter: Drafter | None,
                         k: int = 4, eos_id: int | None = None, sampler: Sampler | None = None,
                         tree: TreeShape | None = None, partial: PartialSpec | None = None,
                         use_kernels: bool | None = None, policy: SpeculationPolicy | None = None,
                         use_graphs: bool | None = None, cache_tokens: int = 0, mark_steps: bool = False,
                         rows: int | None = None, step_pricer: DecodeStepPricer | None = None) -> Generation:
    """Generation of every prompt as one static batch (prefilled in one forward, decoded until its
    last request finishes, each request leaving the step it finishes), greedy (or sampled with
    `sampler`); speculative when `drafter` is given, drafting a chain of k or `tree`; SpecPV
    partial verification with `partial`. use_kernels: verification attention by spec_kernels.attention
    (default: on CUDA; on the CPU it needs TRITON_INTERPRET=1 and runs the Triton code
    interpreted, for tests); policy, step_pricer, use_graphs, cache_tokens, mark_steps: as `serve`;
    rows: the KV cache's rows (default: one per prompt), the same for every batch of a run, so that
    a short last batch keeps the cache and its graphs."""
    B = len(prompts)
    return serve(model, prompts, max_new_tokens, drafter, ServeSpec(max_batch=max(rows or B, B), static=True,
                                                                    concurrency=B), k, eos_id,
                 sampler, tree, partial, use_kernels, policy, use_graphs, cache_tokens, mark_steps, step_pricer)


@torch.inference_mode()
def serve(model: Llama, prompts: list[list[int]], max_new_tokens: int, drafter: Drafter | None, spec: ServeSpec,
          k: int = 4, eos_id: int | None = None, sampler: Sampler | None = None, tree: TreeShape | None = None,
          partial: PartialSpec | None = None, use_kernels: bool | None = None, policy: SpeculationPolicy | None = None,
          use_graphs: bool | None = None, cache_tokens: int = 0, mark_steps: bool = False,
          step_pricer: DecodeStepPricer | None = None) -> Served:
    """Serve every prompt as `spec` says; greedy (or sampled), speculative when `drafter` is given,
    drafting k per step (or `tree`) or what `policy` (sim.policy) chooses each step (a chain of up to
    k, or none: a plain decode step), told each step's records; step_pricer: the step's price at each
    k, the simulator's (what goodput weighs). use_graphs: replay the kernel path's decode, verify and
    chain-draft forwards from CUDA graphs (default: on CUDA; profiler.engine.graphs). cache_tokens: size the KV
    cache for at least this many slots (a warm-up sized like the run after it, which then keeps its
    cache and graphs). mark_steps: each engine step inside a profiler range named STEP_RANGE
    (profiler.live.launches counts in them; off otherwise, since an open range costs some 50 us a
    step on the CPU)."""
    spec.check(len(prompts))
    if policy is not None and (drafter is None or partial is not None):
        raise ValueError("a speculation policy needs a drafter and no partial verification")
    if policy is not None and policy.kind == "goodput" and step_pricer is None:
        raise ValueError("goodput weighs the step's price: give a step_pricer")
    if partial is not None and partial.rectify and sampler is not None:
        raise ValueError("rectify re-checks greedy choices; it takes no temperature")
    shape = (tree or TreeShape(1, k)) if drafter is not None else None
    device = model.lm_head.weight.device
    use_kernels = device.type == "cuda" if use_kernels is None else use_kernels
    use_graphs = use_kernels and device.type == "cuda" if use_graphs is None else use_graphs
    if use_graphs and not use_kernels:
        raise ValueError("CUDA graphs replay the attention kernel's forwards: they need use_kernels")
    graphed = [model] + (drafter.graph_models() if drafter is not None else [])
    for m in graphed:
        if use_graphs:
            enable_graphs(m)
        else:
            disable_graphs(m)
    captures_before, variants_before = _captures(graphed), spec_kernels.variants_met()
    sync = device_sync(device)
    nodes = shape.nodes if shape is not None else 0
    max_seq = max(needed_cache_tokens(prompts, max_new_tokens, nodes, partial), cache_tokens)
    rows = spec.max_batch
    model.setup_cache(rows, max_seq)
    if drafter is not None:
        drafter.prepare_rows(model, rows, max_seq)
    B = len(prompts)
    out = Served(outputs=[[] for _ in range(B)], first_token_s=[0.0] * B, finish_s=[0.0] * B,
                 arrival_s=[0.0] * B, admitted_s=[0.0] * B)
    start = time.perf_counter()
    clock = lambda: time.perf_counter() - start                       # noqa: E731
    sent = spec.concurrency if spec.concurrency is not None else 0    # closed loop: requests sent so far
    sent = min(sent, B)
    waiting: deque[int] = deque(range(sent))                          # arrived, not admitted
    upcoming = 0                                                      # open loop: next request to arrive
    alive: list[RequestState] = []                                    # decoding, in rows 0..n-1
    prefilling: list[_Prefilling] = []
    reserved = 0
    done = 0
    iteration = step = 0

    def finish(r: RequestState, now: float) -> None:
        """r has left its row: its output is final, its KV reservation freed, and in a closed loop
        its client sends the next request."""
        nonlocal reserved, done, sent
        out.outputs[r.request], out.finish_s[r.request] = r.output, now
        reserved -= len(prompts[r.request]) + max_new_tokens
        done += 1
        if spec.concurrency is not None and sent < B:
            out.arrival_s[sent] = now
            waiting.append(sent)
            sent += 1

    while done < B:
        now = clock()
        if spec.arrival_s is not None:
            while upcoming < B and spec.arrival_s[upcoming] <= now:
                out.arrival_s[upcoming] = spec.arrival_s[upcoming]
                waiting.append(upcoming)
                upcoming += 1
        reserved += _admit(prompts, max_new_tokens, spec, waiting, alive, prefilling, reserved, out, now)
        if not alive and not prefilling:
            if spec.arrival_s is None or upcoming >= B:     # an empty engine always admits its queue's head
                raise RuntimeError(f"the engine is empty with {B - done} requests unserved and none to arrive")
            time.sleep(max(spec.arrival_s[upcoming] - clock(), 0.0))
            continue
        iteration += 1
        running = len(alive) + len(prefilling)
        joining = _prefill(model, drafter, prefilling, spec, sampler, iteration, out)
        if alive:
            step += 1
            step_drafter, step_shape = drafter, shape
            if policy is not None:
                contexts = [r.position for r in alive]
                price_s = None if step_pricer is None else (
                    lambda ks, expected: step_pricer.seconds(contexts, ks, expected))
                k_now = policy.choose_k(running, len(alive), price_s)
                if k_now == 0:
                    step_drafter, step_shape = None, None
                    drafter.follow(model, alive)
                elif tree is None and k_now != shape.depth:
                    step_shape = TreeShape(1, k_now)
            with torch.profiler.record_function(STEP_RANGE) if mark_steps else nullcontext():
                records = run_step(model, alive, step_drafter, step_shape, sampler, partial, max_new_tokens, eos_id,
                                   step, use_kernels, start, reader=drafter)
            if policy is not None:
                policy.observe(records)
            out.steps += records
        sync()
        now = clock()
        for i in reversed(range(len(alive))):
            r = alive[i]
            if not output_complete(r.output, max_new_tokens, eos_id):
                continue
            if _unchecked(r, partial):
                r.final_check = True            # SpecPV rectify: one more step checks its last tokens
            else:
                _leave(model, drafter, alive, i)
                finish(r, now)
        for j, entry in enumerate(joining):
            out.first_token_s[entry.state.request] = now
            _join(model, drafter, alive, prefilling + joining[j + 1:], entry)
            if output_complete(entry.state.output, max_new_tokens, eos_id):     # one token asked, or EOS first
                _leave(model, drafter, alive, len(alive) - 1)
                finish(entry.state, now)
    out.wall_s = clock()
    out.prefill_s = sum(c[3] for c in out.prefill_chunks)
    captures_after = _captures(graphed)
    out.cuda_graphs = use_graphs and device.type == "cuda"     # on the CPU the buffers replay without a graph
    out.graph_captures = captures_after[0] - captures_before[0]
    out.graph_capture_s = captures_after[1] - captures_before[1]
    out.kernel_variants = spec_kernels.variants_met() - variants_before
    return out


# The profiler range around each engine step: what `profiler.live.launches` counts launches in.
STEP_RANGE = "engine_step"


def compile_kernels(model: Llama, drafter: Drafter | None, max_query_tokens: int, partial: bool) -> None:
    """Compile every variant of the attention kernel that the target's and the drafter's forwards
    can launch, a forward at most `max_query_tokens` new tokens a row (at most the run's room past
    its output: profiler.live.shared.room_tokens), with SpecPV's partial index when `partial`
    (spec_kernels.warm_up_attention), before anything is timed: a SpecPV re-feed or a policy's k
    then finds its kernel compiled, whatever its length."""
    shapes = {(m.config.heads, m.config.kv_heads, m.config.head_dim, m.lm_head.weight.dtype, m.lm_head.weight.device)
              for m in [model] + (drafter.graph_models() if drafter is not None else [])}
    for heads, kv_heads, head_dim, dtype, device in shapes:
        spec_kernels.warm_up_attention(heads, kv_heads, head_dim, dtype, device, max_query_tokens, partial)


def needed_cache_tokens(prompts: list[list[int]], max_new_tokens: int, nodes: int, partial: PartialSpec | None) -> int:
    """KV slots a run of these prompts needs: the longest prompt and output, and `room_past_output`."""
    return max(len(p) for p in prompts) + max_new_tokens + room_past_output(nodes, partial)


def room_past_output(nodes: int, partial: PartialSpec | None) -> int:
    """KV slots a row needs past its prompt and output: a step's drafts twice (the tree's slots, then
    the accepted path moved), SpecPV's re-feed padding and the trash slot."""
    return 2 * (nodes + 1) + refeed_room(partial, nodes) + 2


def _captures(models: list[Llama]) -> tuple[int, float]:
    """Graphs captured so far on these models, and the seconds capturing took."""
    graphs = [m.step_graphs for m in models if m.step_graphs is not None]
    return sum(g.captures for g in graphs), sum(g.capture_s for g in graphs)


def _admit(prompts, max_new_tokens, spec: ServeSpec, waiting: deque, alive: list, prefilling: list, reserved: int,
           out: Served, now: float) -> int:
    """Admit waiting requests, oldest first, into free rows (static: only into an empty engine).
    Returns the KV tokens they reserve."""
    if spec.static and (alive or prefilling):
        return 0
    taken = {e.row for e in prefilling} | set(range(len(alive)))
    free = [row for row in reversed(range(spec.max_batch)) if row not in taken]
    added = 0
    while waiting and free:
        rid = waiting[0]
        need = len(prompts[rid]) + max_new_tokens
        if spec.kv_budget_tokens is not None and reserved + added + need > spec.kv_budget_tokens and (alive or prefilling):
            break
        waiting.popleft()
        row = free.pop() if spec.static else free.pop(0)     # static: rows 0.. in order (one prompt forward)
        prefilling.append(_Prefilling(RequestState(rid, list(prompts[rid]), len(prompts[rid])), row))
        out.admitted_s[rid] = now
        added += need
    return added


def _prefill(model: Llama, drafter: Drafter | None, prefilling: list[_Prefilling], spec: ServeSpec,
             sampler: Sampler | None, iteration: int, out: Served) -> list[_Prefilling]:
    """This iteration's prefill: static, every admitted prompt in one forward; continuous, up to
    prefill_chunk tokens, oldest request first. Returns the requests whose prompt is complete,
    their first token appended."""
    from profiler.engine.generate import prefill_chunk_logits, prefill_logits

    if not prefilling:
        return []
    device = model.lm_head.weight.device
    sync = device_sync(device)
    complete: list[tuple[_Prefilling, torch.Tensor]] = []
    if spec.static:
        t0 = time.perf_counter()
        chunks = [e.state.history for e in prefilling]
        logits = prefill_logits(model, chunks, prefilling[0].row)
        if drafter is not None:
            drafter.prefill(chunks, 0, prefilling[0].row)
        sync()
        seconds = (time.perf_counter() - t0) / len(prefilling)
        for e, row_logits in zip(prefilling, logits):
            e.done = len(e.state.history)
            out.prefill_chunks.append((iteration, e.state.request, e.done, seconds))
            complete.append((e, row_logits))
    else:
        budget = spec.prefill_chunk
        for e in prefilling:
            if budget == 0:
                break
            take = min(budget, e.state.prompt_tokens - e.done)
            chunk = e.state.history[e.done:e.done + take]
            t0 = time.perf_counter()
            logits = prefill_chunk_logits(model, chunk, e.done, e.row)
            if drafter is not None:
                drafter.prefill([chunk], e.done, e.row)
            sync()
            out.prefill_chunks.append((iteration, e.state.request, take, time.perf_counter() - t0))
            e.done += take
            budget -= take
            if e.done == e.state.prompt_tokens:
                complete.append((e, logits))
    if not complete:
        return []
    logits = torch.stack([row_logits for _, row_logits in complete])                     # [C, V]
    tokens = logits.argmax(-1) if sampler is None else sampler.draw(logits)[0]
    for (e, _), token in zip(complete, tokens.tolist()):
        e.state.history.append(int(token))
        prefilling.remove(e)
    return [e for e, _ in complete]


def _join(model: Llama, drafter: Drafter | None, alive: list[RequestState], others: list[_Prefilling],
          entry: _Prefilling) -> None:
    """A request whose prompt is in moves to row n, the first after the decoding rows; a request
    of `others` (prefilling, or yet to join) found there takes the row it leaves."""
    n = len(alive)
    if entry.row != n:
        other = next((e for e in others if e.row == n), None)
        length = max(entry.done, other.done if other is not None else 0)
        _swap(model, drafter, entry.row, n, length)
        if other is not None:
            other.row = entry.row
        entry.row = n
    alive.append(entry.state)


def _leave(model: Llama, drafter: Drafter | None, alive: list[RequestState], i: int) -> None:
    """Request i leaves the decoding rows; the last decoding request takes its row."""
    last = len(alive) - 1
    if i != last:
        _swap(model, drafter, i, last, max(alive[i].position, alive[last].position))
        alive[i] = alive[last]
    alive.pop()


def _swap(model: Llama, drafter: Drafter | None, a: int, b: int, length: int) -> None:
    model.swap_rows(a, b, length)
    if drafter is not None:
        drafter.swap_rows(a, b, length)


def _unchecked(r: RequestState, partial: PartialSpec | None) -> bool:
    """SpecPV rectify: tokens committed since the last refresh still await a full verification."""
    return partial is not None and partial.rectify and r.refresh is not None and r.position > r.refresh
