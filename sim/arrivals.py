"""Requests reaching the engine's queue: SimPy processes on the simulated clock.

A closed loop's clients each send a request and the next when the last is done (`closed_concurrency`
of them); open loops (Poisson, a trace) send each request at its own arrival time
(sim/workload.py drew both, by seed). Every arrival is recorded and wakes an idle engine.
"""
from __future__ import annotations

from collections import deque
import numpy as np
import simpy

from sim.workload import Requests


class Arrivals:
    """Feeds `queue` with request ids; arrival_s [requests] records when each arrived."""

    def __init__(self, env: simpy.Environment, requests: Requests, queue: deque, arrival_s: np.ndarray):
        self.env, self.requests, self.queue, self.arrival_s = env, requests, queue, arrival_s
        self.closed = requests.closed_concurrency is not None
        self.next_closed = 0
        self.waiting_engine: simpy.Event | None = None

    def next_arrival(self) -> simpy.Event:
        """What an idle engine waits on: the next request's arrival."""
        self.waiting_engine = self.env.event()
        return self.waiting_engine

    def start(self) -> None:
        """A closed loop's clients each send their first request now; an open loop's requests come
        in their own time."""
        if self.closed:
            for _ in range(self.requests.closed_concurrency):
                self.send_next_closed()
        else:
            self.env.process(self.open_loop())

    def arrive(self, rid: int) -> None:
        self.arrival_s[rid] = self.env.now
        self.queue.append(rid)
        if self.waiting_engine is not None:
            event, self.waiting_engine = self.waiting_engine, None
            event.succeed()

    def open_loop(self):
        """Poisson or trace arrivals: each request enters the queue at its arrival time."""
        for rid, at_s in enumerate(self.requests.arrival_s):
            if at_s > self.env.now:
                yield self.env.timeout(at_s - self.env.now)
            self.arrive(rid)

    def done(self) -> None:
        """A request finished: in a closed loop its client sends the next."""
        if self.closed:
            self.send_next_closed()

    def send_next_closed(self) -> None:
        if self.next_closed < len(self.requests):
            self.arrive(self.next_closed)
            self.next_closed += 1
