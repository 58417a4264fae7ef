"""The decoding requests of a simulated engine, as compact arrays: what a step is planned over.

Every field is a row of one [fields, capacity] array, so adding or removing a request is one numpy
assignment whatever the number of fields, and a step over slots 0..n-1 is a handful of numpy
operations on views, not a loop over requests.
"""
from __future__ import annotations

import numpy as np

INT = np.int64


class DecodeSlots:
    """Per-request state of decoding requests, compact in slots 0..n-1."""
    FIELDS = ("rid", "ctx", "finish", "steps", "last", "since", "steps_since", "selected", "admit", "final", "idle")
    # rid: request id; ctx: tokens with positions (prompt + committed output); finish: ctx at which
    # the request is done; steps: verification steps taken; last: tokens the previous step
    # committed; since / steps_since: SpecPV tokens and partial steps since the last refresh;
    # selected: SpecPV partial cache holds a selection (0/1); admit: admission order (preemption);
    # final: SpecPV rectify's last check before the request ends is due (0/1); idle: a static
    # batch's row whose request is done but which runs on, padding, until the batch ends (0/1).
    # Each a row of `state`, set in __init__ (declared here for the type checker).
    rid: np.ndarray
    ctx: np.ndarray
    finish: np.ndarray
    steps: np.ndarray
    last: np.ndarray
    since: np.ndarray
    steps_since: np.ndarray
    selected: np.ndarray
    admit: np.ndarray
    final: np.ndarray
    idle: np.ndarray

    def __init__(self, capacity: int):
        self.n = 0
        self.state = np.zeros((len(self.FIELDS), capacity), INT)
        for row, name in enumerate(self.FIELDS):
            setattr(self, name, self.state[row])
        # Running sums over slots 0..n-1 that every step's pricing reads: the context tokens, and
        # the tokens the previous step committed (what a drafter with its own KV catches up on).
        self.ctx_sum = 0
        self.last_sum = 0

    def add(self, rid: int, ctx: int, finish: int, admit: int) -> None:
        self.state[:, self.n] = (rid, ctx, finish, 0, 1, 0, 0, 0, admit, 0, 0)
        self.n += 1
        self.ctx_sum += ctx
        self.last_sum += 1

    def remove(self, i: int) -> tuple[int, int]:
        """Remove slot i (the last slot takes its place); returns its request id and context."""
        rid, ctx, last = self.rid.item(i), self.ctx.item(i), self.last.item(i)
        self.ctx_sum -= ctx
        self.last_sum -= last
        self.n -= 1
        if i != self.n:
            self.state[:, i] = self.state[:, self.n]
        return rid, ctx

    def hold(self, contexts) -> None:
        """Exactly these decoding contexts (one a request), fresh: what a step is priced over
        outside a simulation (sim/step_price.py)."""
        n = len(contexts)
        self.n = n
        self.ctx[:n] = contexts
        self.last[:n] = 1
        self.steps[:n] = 0
        self.ctx_sum, self.last_sum = int(self.ctx[:n].sum()), n

    def subset(self, rows: np.ndarray) -> "DecodeSlots":
        """A copy holding only slots `rows`, compact (an attention data-parallel rank's requests)."""
        part = DecodeSlots(max(len(rows), 1))
        m = len(rows)
        part.state[:, :m] = self.state[:, rows]
        part.n = m
        part.ctx_sum, part.last_sum = int(part.ctx[:m].sum()), int(part.last[:m].sum())
        return part
