"""Prefill and decode on separate pools: the prefill servers, the KV transfer, the hand-off.

With `disaggregation` (sim/scenario/disaggregation.py) a request goes to a prefill server (round
robin over the pool's instances), waits for its prompt to be prefilled there in chunks of the
server's `prefill_chunk` (oldest first, the step priced by the server's own layout through the same
planner and pricer as any step: sim/step.py), then its KV cache crosses the link to the decode
pool, every GPU of the server sending its own shard; on arrival it waits in the decode pool's queue
and joins a decode batch with its first token (the prefill's) committed. A request's TTFT is its
arrival to that moment: queueing and prefill on the prefill pool, the transfer, and queueing for a
decode slot. With `prefill: unlimited` the KV is on the decode pool when the request arrives (a
decode pool measured alone, as engine blogs measure one with a saturated pool).

    Disaggregated(env, scenario, ...)     the decode pipeline's arrivals (sim/pipeline.py)
      PoolArrivals                        clients -> prefill servers (closed loop, Poisson, trace)
      PrefillServer.serve()               one SimPy process a server
      transfer_s(prompt tokens)           then Disaggregated.hand_off(rid) -> the decode queue
"""
from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from sim.arrivals import Arrivals
from sim.cost.batch import PHASES
from sim.cost.memory import plan_memory
from sim.cost.model import cost_model_for
from sim.cost.stack import build_stacks
from sim.errors import InputError
from sim.prefill import prefill_chunks
from sim.scenario.disaggregation import PrefillPool
from sim.scenario.schema import Scenario
from sim.slots import DecodeSlots
from sim.step import plan_step, price, step_config
from sim.workload import Requests


def prefill_pool(scenario: Scenario) -> PrefillPool | None:
    """The scenario's prefill pool, or None where it has none (one pool, or prefill unlimited)."""
    d = scenario.disaggregation
    return d.prefill if d is not None and isinstance(d.prefill, PrefillPool) else None


def prefill_scenario(scenario: Scenario) -> Scenario:
    """The scenario as one prefill server runs it: the prefill pool's layout and chunk."""
    p = prefill_pool(scenario)
    assert p is not None        # asked only of a scenario with a prefill pool
    return scenario.model_copy(update={
        "tensor_parallel": p.tensor_parallel, "data_parallel": p.data_parallel, "expert_parallel": p.expert_parallel,
        "redundant_experts": 0, "disaggregation": None,
        "scheduler": scenario.scheduler.model_copy(update={"prefill_chunk": p.prefill_chunk})})


class Inbox:
    """Request ids waiting for a SimPy process (a prefill server, the decode pipeline), and the
    event it sleeps on while there are none."""

    def __init__(self, env: simpy.Environment, queue: deque):
        self.env, self.queue = env, queue
        self.wake: simpy.Event | None = None

    def put(self, rid: int) -> None:
        self.queue.append(rid)
        if self.wake is not None:
            event, self.wake = self.wake, None
            event.succeed()

    def next_arrival(self) -> simpy.Event:
        self.wake = self.env.event()
        return self.wake


class PrefillServer:
    """One prefill server: its queue, and the SimPy process that prefills it in chunks."""

    def __init__(self, pools: "Disaggregated", config, cost, chunk_tokens: int):
        self.pools, self.config, self.cost, self.chunk_tokens = pools, config, cost, chunk_tokens
        self.inbox = Inbox(pools.env, deque())
        self.prefilling: list[list[int]] = []     # [rid, tokens done, prompt tokens]
        self.no_rows = DecodeSlots(1)

    def serve(self):
        pools, queue = self.pools, self.inbox.queue
        scratch = [0.0] * len(PHASES)
        while True:
            while queue:
                rid = queue.popleft()
                self.prefilling.append([rid, 0, pools.prompt_tokens[rid]])
            if not self.prefilling:
                yield self.inbox.next_arrival()
                continue
            chunks = prefill_chunks(self.prefilling, self.chunk_tokens)
            step_s = price(plan_step(self.config, self.config.shape(0), self.no_rows, 0, chunks), self.cost, scratch)
            yield pools.env.timeout(step_s)
            for entry, chunk in chunks:
                entry[1] += chunk
            done = [e[0] for e in self.prefilling if e[1] == e[2]]
            if done:
                self.prefilling = [e for e in self.prefilling if e[1] < e[2]]
                for rid in done:
                    pools.send(rid)


class PoolArrivals(Arrivals):
    """The clients' requests to the prefill servers, round robin (or, with an unlimited prefill
    pool, straight to the decode pool's queue)."""

    def __init__(self, pools: "Disaggregated", requests: Requests, arrival_s: np.ndarray):
        super().__init__(pools.env, requests, deque(), arrival_s)
        self.pools = pools

    def arrive(self, rid: int) -> None:
        self.arrival_s[rid] = self.env.now
        servers = self.pools.servers
        if servers:
            servers[rid % len(servers)].inbox.put(rid)
        else:
            self.pools.hand_off(rid)


class Disaggregated:
    """The decode pipeline's arrivals when prefill runs on a pool of its own: requests reach its
    queue (`queue`, the pipeline's waiting deque) once prefilled and transferred, with their KV
    (`kv_ready`). The pipeline calls `start`, `next_arrival` and `done` as it would an Arrivals'."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, requests: Requests, queue: deque,
                 arrival_s: np.ndarray, speculative: bool, max_request_tokens: int):
        self.env, self.scenario = env, scenario
        self.inbox = Inbox(env, queue)          # the decode pool's queue
        self.prompt_tokens = requests.prompt_tokens.tolist()
        self.kv_ready = np.zeros(len(requests), dtype=bool)
        self.servers: list[PrefillServer] = []
        self.warnings: list[str] = []
        d = scenario.disaggregation
        assert d is not None        # made only for a disaggregated scenario
        self.transfer_latency_s = d.transfer.latency_s
        self.bytes_per_token = 0.0
        self.link_bytes_s = 1.0
        pool = prefill_pool(scenario)
        if pool is not None:
            server = prefill_scenario(scenario)     # the baseline's configuration has no speculation
            stacks = build_stacks(server)
            try:
                memory = plan_memory(server, stacks, max_request_tokens, 1)
            except InputError as error:
                raise InputError("disaggregation.prefill", f"a prefill server: {error}") from None
            cost = cost_model_for(server)
            self.warnings = [f"prefill pool: {w}" for w in cost.warnings]
            config = step_config(server, stacks, memory, cost, speculative)
            self.servers = [PrefillServer(self, config, cost, pool.prefill_chunk) for _ in range(pool.instances)]
            # Each GPU of the server sends its own shard of the prompt's KV (the draft's too).
            self.bytes_per_token = memory.kv_bytes_per_token
            hw = scenario.hardware_spec
            rate_gb_s = d.transfer.gb_s or (hw.network_gb_s if d.transfer.link == "network" else hw.interconnect_gb_s)
            self.link_bytes_s = rate_gb_s * 1e9
        self.arrivals = PoolArrivals(self, requests, arrival_s)

    def transfer_s(self, prompt_tokens: int) -> float:
        """A prompt's KV cache from its prefill server to the decode pool."""
        return self.transfer_latency_s + prompt_tokens * self.bytes_per_token / self.link_bytes_s

    def send(self, rid: int) -> None:
        """A prompt is prefilled: its KV crosses the link, then the request is the decode pool's."""
        self.env.timeout(self.transfer_s(self.prompt_tokens[rid])).callbacks.append(lambda _: self.hand_off(rid))

    def hand_off(self, rid: int) -> None:
        self.kv_ready[rid] = True
        self.inbox.put(rid)

    # -- what the decode pipeline asks of its arrivals ---------------------------------------------

    def start(self) -> None:
        for server in self.servers:
            self.env.process(server.serve())
        self.arrivals.start()

    def next_arrival(self) -> simpy.Event:
        return self.inbox.next_arrival()

    def done(self) -> None:
        self.arrivals.done()
