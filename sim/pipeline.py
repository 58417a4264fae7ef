"""The SimPy model of a serving engine running speculative decoding: the scheduler and its process.

One replica serves a stream of requests with continuous batching (or static batches). Each engine
iteration is one SimPy event: the scheduler admits waiting requests while batch slots and KV memory
allow, gives prefilling requests a chunk of the prefill token budget, asks the policy for the step's
k, has the step planned and priced (sim/step.py: the drafter's work, then one target forward over
the whole batch), waits that long, and commits what each decoding request accepted (the acceptance
model's draw, SpecPV's accounting in sim/specpv.py). Closed-loop, Poisson and trace arrivals are
SimPy processes feeding a queue. Decoding requests live in compact arrays (sim/slots.py).

    scenario -> pipeline (schedule) -> plan_step -> price -> result
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np
import simpy

from sim.acceptance import AcceptanceModel
from sim.arrivals import Arrivals
from sim.cost.memory import MemoryPlan
from sim.cost.stack import Stacks
from sim.lanes import LaneAcceptance
from sim.policy import build_policy
from sim.pools import Disaggregated
from sim.prefill import prefill_chunks
from sim.result import RunRecord
from sim.scenario.schema import Scenario
from sim.slots import DecodeSlots
from sim.specpv import account_partial_verify, hold_last_check, unchecked_divergence
from sim.step import decode_tokens, plan_step, price, price_decode_steps, step_config
from sim.workload import Requests

BUCKETS_PER_DOUBLING = 8      # goodput re-decides when the context or the prompt chunk moves by ~9%


class PipelineSimulation:
    """acceptance: the speculative run's draws (None: the baseline); lanes: route and combine's
    per-row drafters (sim/lanes.py), whose LaneAcceptance is then also the acceptance."""

    def __init__(self, scenario: Scenario, requests: Requests, cost, stacks: Stacks, memory: MemoryPlan,
                 acceptance: AcceptanceModel | None, rng: np.random.Generator, lanes: LaneAcceptance | None = None):
        self.scenario, self.requests, self.cost, self.memory, self.rng = scenario, requests, cost, memory, rng
        self.acceptance = acceptance
        self.lanes = lanes
        speculative = acceptance is not None
        self.steps = step_config(scenario, stacks, memory, cost, speculative,
                                 acceptance.verify_tokens if speculative else None,
                                 speculative and acceptance.plain_steps, lanes)
        self.speculative = self.steps.speculative
        self.policy = build_policy(scenario.speculation, acceptance.survival if self.speculative else None)
        self.adaptive = self.speculative and self.policy.adaptive
        self.chain = scenario.speculation.tree is None
        self.shape = self.steps.full          # this step's k: a policy's choice, else all the scenario drafts
        self.predrawn: tuple[np.ndarray, int] | None = None    # the oracle's outcome of this step
        self.final_check = self.steps.partial is not None and self.steps.partial.rectify
        sched = scenario.scheduler
        self.static = sched.batching == "static"
        self.static_end_first = self.static and sched.static_end == "first"
        self.max_batch = min(sched.max_batch, memory.max_running or sched.max_batch)
        self.prefill_chunk = sched.prefill_chunk
        self.budget_includes_decode = sched.budget_includes_decode
        self.reserve_tokens = memory.partial_cache_tokens
        # What the hot path must keep per request; each skipped array op is a microsecond.
        self.track_steps = self.speculative and acceptance.uses_steps
        self.rids_for_draw = self.speculative and acceptance.uses_rids
        self.context_for_draw = self.speculative and acceptance.uses_context

        n = len(requests)
        self.record = RunRecord(first_token_s=np.full(n, np.nan), finish_s=np.full(n, np.nan),
                                arrival_s=requests.arrival_s.copy(), output_tokens=requests.output_tokens.copy())
        self.env = simpy.Environment()
        self.waiting: deque[int] = deque()
        self.prefilling: list[list[int]] = []   # [rid, tokens done, tokens to prefill]
        self.slots = DecodeSlots(self.max_batch)
        # Per-request scalars as Python lists: the admission and finish paths index them one at a time.
        self.generated = [0] * n                # output tokens committed so far, kept across preemption
        self.prompt_tokens = requests.prompt_tokens.tolist()
        self.output_tokens = requests.output_tokens.tolist()
        self.kv_used_tokens = 0
        self.admitted = self.finished = 0
        self.arrivals: Arrivals | Disaggregated = Arrivals(self.env, requests, self.waiting, self.record.arrival_s)
        # Prefill on a pool of its own: requests reach this (decode) pool prefilled, KV included.
        self.kv_ready: np.ndarray | None = None
        if scenario.disaggregation is not None:
            self.arrivals = Disaggregated(self.env, scenario, requests, self.waiting, self.record.arrival_s,
                                          speculative, requests.max_tokens + self.steps.verify_tokens)
            self.kv_ready = self.arrivals.kv_ready

    # ---- scheduling -----------------------------------------------------------------------------
    def admit_waiting(self) -> None:
        """FIFO admission while a batch slot and KV memory for the prompt are free."""
        capacity = self.memory.kv_capacity_tokens
        if self.static and (self.slots.n or self.prefilling):
            return                      # a static batch admits nobody until it is done
        while self.waiting and self.slots.n + len(self.prefilling) < self.max_batch:
            rid = self.waiting[0]
            prompt = self.prompt_tokens[rid] + self.generated[rid]
            prefilled = self.kv_ready is not None and self.kv_ready[rid] and not self.generated[rid]
            need = prompt + prefilled + self.reserve_tokens + self.steps.verify_tokens
            if self.kv_used_tokens + need > capacity:
                break
            self.waiting.popleft()
            if prefilled:
                self.join_prefilled(rid)
                continue
            self.prefilling.append([rid, 0, prompt])
            self.kv_used_tokens += prompt + self.reserve_tokens

    def join_prefilled(self, rid: int) -> None:
        """A request prefilled on the prefill pool joins the decode slots with its KV and its first
        token (the prefill's), which reaches its client now."""
        prompt, output = self.prompt_tokens[rid], self.output_tokens[rid]
        self.kv_used_tokens += prompt + 1 + self.reserve_tokens
        self.generated[rid] = 1
        self.admitted += 1
        self.record.first_token_s[rid] = self.env.now
        self.slots.add(rid, prompt + 1, prompt + output, self.admitted)
        if output <= 1:
            self.finish_requests(self.env.now)

    def make_room_for_step(self) -> None:
        """Preempt the newest decoding requests (recompute) until this step's KV growth fits."""
        s = self.slots
        while s.n and self.kv_used_tokens + s.n * self.shape.verify_tokens > self.memory.kv_capacity_tokens:
            rid, ctx = self.release_slot(int(np.argmax(s.admit[:s.n])))
            self.generated[rid] = ctx - self.prompt_tokens[rid]
            self.waiting.appendleft(rid)
            self.record.preemptions += 1

    def release_slot(self, i: int) -> tuple[int, int]:
        """Remove decoding slot i and its KV."""
        rid, ctx = self.slots.remove(i)
        self.kv_used_tokens -= ctx + self.reserve_tokens
        return rid, ctx

    def step_chunks(self, shape, n: int) -> list[tuple[list[int], int]]:
        """This step's prompt chunks beside n decoding requests at `shape`: the prefill token budget
        less, where they count, the decoding requests' tokens."""
        predrawn = self.predrawn[0] if self.predrawn is not None else None
        decoding = decode_tokens(self.steps, shape, self.slots, n, predrawn) if self.budget_includes_decode else 0
        return prefill_chunks(self.prefilling, max(self.prefill_chunk - decoding, 0))

    # ---- the policy ------------------------------------------------------------------------------
    def choose_speculation(self) -> None:
        """Set this iteration's drafts per request from the policy (0: a plain decode step)."""
        n, s = self.slots.n, self.slots
        if n == 0 or (self.static and self.prefilling):
            self.shape = self.steps.shape(0)
            return
        if self.policy.kind == "oracle":
            # Oracle proposal: draw the step's outcome first, then propose exactly what will be
            # accepted (each row its own accepted drafts; the chain's forwards run to the longest).
            self.predrawn = self.acceptance.draw(n, s.rid[:n] if self.rids_for_draw else None,
                                                 s.steps[:n] if self.track_steps else None,
                                                 s.ctx[:n] if self.context_for_draw else None)
            self.shape = self.steps.shape(int(self.predrawn[0].max()) - 1)
            return
        running = n + len(self.prefilling)
        state = goodput_state(s.ctx_sum / n, self.prefilling, self.prefill_chunk)
        chunks_at = (lambda k: self.step_chunks(self.steps.shape(k), n)) if self.prefilling else None
        price_s = lambda ks, expected: price_decode_steps(self.steps, self.cost, s, n, ks, expected,  # noqa: E731
                                                          chunks_at)
        self.shape = self.steps.shape(self.policy.choose_k(running, n, price_s, state))

    # ---- the engine process ---------------------------------------------------------------------
    def serve(self):
        record = self.record
        total = len(self.requests)
        shares = record.phase_s
        while self.finished < total:
            if self.waiting:
                self.admit_waiting()
            if self.slots.n == 0 and not self.prefilling:
                # plan_memory guarantees the longest request fits an empty cache, so an idle engine
                # means an empty queue: wait for the next arrival.
                yield self.arrivals.next_arrival()
                continue
            if self.adaptive:
                self.choose_speculation()
            if self.kv_used_tokens + self.slots.n * self.shape.verify_tokens > self.memory.kv_capacity_tokens:
                self.make_room_for_step()
                if self.predrawn is not None and len(self.predrawn[0]) != self.slots.n:
                    self.choose_speculation()     # the oracle drew for requests since preempted
            # A static batch decodes only once all its prompts are prefilled (in chunks).
            n = 0 if self.static and self.prefilling else self.slots.n
            if self.adaptive and n:
                # The oracle's rows each draft their own accepted count: their mean.
                record.drafted_k.append(self.shape.k if self.predrawn is None else float(self.predrawn[1] / n - 1))
            chunks = self.step_chunks(self.shape, n) if self.prefilling else ()
            plan = plan_step(self.steps, self.shape, self.slots, n, chunks,
                             self.predrawn[0] if self.predrawn is not None and n else None)
            step_s = price(plan, self.cost, shares)
            yield self.env.timeout(step_s)
            record.step_s.append(step_s)
            if not chunks:
                record.decode_only_s += step_s
            self.commit(chunks, plan, n)

    def commit(self, chunks, plan, n: int) -> None:
        """Apply the iteration's outcome at its end time: prefill progress, accepted tokens of slots
        0..n-1, finishes."""
        now = self.env.now
        s, record = self.slots, self.record
        record.decoding.append(n)
        if n:
            if self.shape.drafting or self.predrawn is not None or self.static or self.steps.track_last:
                committed, grown = self.draw_committed(plan, n)
            else:                              # a plain decode step: one token each
                committed, grown = 1, n
            ctx = s.ctx[:n]
            ctx += committed
            s.ctx_sum += grown
            self.kv_used_tokens += grown
            done = ctx >= s.finish[:n]
            ended = np.count_nonzero(done)      # far cheaper than done.any() on small arrays
            if not chunks:
                record.decode_only_tokens += grown
                if self.shape.drafting and ended:
                    # Output tokens only: a step may commit past a request's last token (only a
                    # request at or past its end can), ctx - max(finish, ctx before the step).
                    last = ctx[done]
                    record.decode_only_tokens -= int((last - np.maximum(s.finish[:n][done], last - committed[done])).sum())
            if self.final_check and ended:
                done = hold_last_check(s, n, done)
                ended = np.count_nonzero(done)
            if self.static:
                self.finish_static(now, done)
            elif ended:
                self.finish_requests(now, done.nonzero()[0])
        if chunks:
            for entry, chunk in chunks:
                entry[1] += chunk
            if any(e[1] == e[2] for e, _ in chunks):
                self.start_decoding(now)
        if self.kv_used_tokens > record.peak_kv_tokens:
            record.peak_kv_tokens = self.kv_used_tokens

    def draw_committed(self, plan, n: int):
        """Tokens each of slots 0..n-1 commits at this step ([n], or 1 for every row) and their sum;
        the rows' step counts, catch-up tokens and SpecPV state updated."""
        s, record = self.slots, self.record
        # A static batch's finished rows run on as padding and commit nothing.
        idle = s.idle[:n] == 1 if self.static else None
        padding = idle is not None and np.count_nonzero(idle)
        if not self.shape.drafting and self.predrawn is None:
            if self.steps.track_last:
                # Drafting off this step: the draft read the step's input token, and is as far
                # behind as the target, by the token just committed.
                s.last[:n] = 1
                s.last_sum = n
            if padding:
                committed = np.where(idle, 0, 1)
                return committed, int(committed.sum())
            return 1, n
        if self.predrawn is not None:
            # The oracle drew this step's outcome before choosing its proposals.
            (committed, grown), self.predrawn = self.predrawn, None
        else:
            committed, grown = self.acceptance.draw(n, s.rid[:n] if self.rids_for_draw else None,
                                                    s.steps[:n] if self.track_steps else None,
                                                    s.ctx[:n] if self.context_for_draw else None)
            if self.shape.verify_tokens < self.steps.verify_tokens and self.chain:
                # A chain cut at k keeps its first k drafts: min(accepted, k) of them.
                committed = np.minimum(committed, self.shape.verify_tokens)
                grown = int(committed.sum())
        if padding:
            committed = np.where(idle, 0, committed)
            grown = int(committed.sum())
        if not plan.replayed_plain:
            record.committed.append(committed[~idle] if padding else committed)
        if self.track_steps:
            s.steps[:n] += 1
        if self.steps.track_last:
            s.last[:n] = committed
            s.last_sum = grown
        if self.steps.partial is not None:
            committed = account_partial_verify(self.steps.partial, s, n, committed, plan.full, plan.partial, record,
                                               self.acceptance.rolled_back, self.rng)
            grown = int(committed.sum())
        return committed, grown

    def start_decoding(self, now: float) -> None:
        """Requests whose prefill completed produced their first token and join the decode slots."""
        still = []
        one_token_output = False
        for entry in self.prefilling:
            rid, done, total = entry
            if done < total:
                still.append(entry)
                continue
            generated = self.generated[rid]
            if generated == 0:
                self.record.first_token_s[rid] = now
            output = self.output_tokens[rid]
            one_token_output |= generated + 1 >= output
            self.generated[rid] = generated + 1
            self.kv_used_tokens += 1
            self.admitted += 1
            self.slots.add(rid, total + 1, self.prompt_tokens[rid] + output, self.admitted)
        self.prefilling = still
        if one_token_output:   # done at prefill
            self.finish_requests(now)

    def finish_requests(self, now: float, done: np.ndarray | None = None) -> None:
        """Requests that reached their output length leave (slots `done`, default: find them)."""
        s, record = self.slots, self.record
        if done is None:
            done = np.flatnonzero(s.ctx[:s.n] >= s.finish[:s.n])
        pv = self.steps.partial
        if pv is not None and pv.rectify:
            # Tokens accepted since the last full verification were never re-checked.
            record.divergent_tokens += unchecked_divergence(pv, s.since[done], s.ctx[done])
        for i in done[::-1].tolist():
            rid, _ = self.release_slot(i)
            self.finish(rid, now)

    def finish(self, rid: int, now: float) -> None:
        """Request rid is done; in a closed loop its client sends the next."""
        self.record.finish_s[rid] = now
        self.finished += 1
        self.arrivals.done()

    def finish_static(self, now: float, done: np.ndarray) -> None:
        """A static batch: requests that reached their output length are done now, but their rows
        run on (idle) until every row of the batch is done; then the batch leaves together. With
        static_end first, the first request done ends the batch: every row is done with the output
        it has committed."""
        s, record = self.slots, self.record
        n = s.n
        newly = done & (s.idle[:n] == 0)
        if self.static_end_first and np.count_nonzero(newly):
            newly = s.idle[:n] == 0
            rids = s.rid[:n][newly]
            record.output_tokens[rids] = (np.minimum(s.ctx[:n][newly], s.finish[:n][newly])
                                          - self.requests.prompt_tokens[rids])
        if np.count_nonzero(newly):
            pv = self.steps.partial
            if pv is not None and pv.rectify:
                record.divergent_tokens += unchecked_divergence(pv, s.since[:n][newly], s.ctx[:n][newly])
            for rid in s.rid[:n][newly].tolist():
                self.finish(rid, now)
            s.idle[:n][newly] = 1
        if n and np.count_nonzero(s.idle[:n]) == n:
            for i in range(n - 1, -1, -1):
                self.release_slot(i)

    def run(self) -> RunRecord:
        self.arrivals.start()
        self.env.process(self.serve())
        self.env.run()
        if self.lanes is not None:
            self.record.lookup_share = self.lanes.lookup_share()
        return self.record


def goodput_state(mean_context: float, prefilling: list[list[int]], prefill_chunk: int) -> tuple[int, int]:
    """What goodput's choice depends on besides the batch: its mean context and the prompt tokens
    riding in the step, each bucketed to within about 9%."""
    prefill = sum(min(e[2] - e[1], prefill_chunk) for e in prefilling[:4]) if prefilling else 0
    return (int(math.log2(mean_context) * BUCKETS_PER_DOUBLING),
            int(math.log2(1 + min(prefill, prefill_chunk)) * BUCKETS_PER_DOUBLING))
