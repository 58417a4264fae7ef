"""Static draft trees and their verification: greedy walk, and recursive rejection sampling
(SpecInfer) that keeps the target's distribution.

A `TreeShape(width, depth)` is `width` branches from the root (the last committed token), each a
chain of `depth` drafted tokens: width x depth nodes, `width` tokens per draft forward, as the
simulator's `tree: {width: W, depth: D}` prices it. A chain of k is the tree (1, k). Node n =
branch * depth + (level - 1) sits at cache slot root + 1 + n and rotary position root + level;
its ancestors are the root and the nodes of its own branch up to its level.

Verification walks from the root. Greedy: follow the child equal to the target's argmax.
Stochastic (SpecInfer's multi-step speculative sampling): the children of a node were drawn from
distributions q_1..q_m (the same q for i.i.d. samples of a model draft; one-hot for deterministic
candidates); child c_i is accepted with probability min(1, p(c_i) / q_i(c_i)), and after each
rejection p becomes normalize(max(0, p - q_i)); when every child is rejected the next token is
drawn from the last p. The output is distributed exactly as the target samples it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from profiler.engine.sampling import sample


@dataclass(frozen=True)
class TreeShape:
    width: int
    depth: int

    @property
    def nodes(self) -> int:
        return self.width * self.depth

    def node(self, branch: int, level: int) -> int:
        """Index of the node at `level` (1-based) of `branch`."""
        return branch * self.depth + level - 1

    @cached_property
    def levels(self) -> Tensor:
        """[nodes] level (1..depth) of each node: its rotary offset from the root."""
        return torch.arange(self.nodes) % self.depth + 1

    @cached_property
    def ancestors(self) -> Tensor:
        """[nodes, nodes] bool: node i may attend node j (j is i or one of its ancestors)."""
        branch = torch.arange(self.nodes) // self.depth
        same_branch = branch[:, None] == branch[None, :]
        return same_branch & (self.levels[None, :] <= self.levels[:, None])

    def level_nodes(self, level: int) -> Tensor:
        """The `width` nodes at `level`, one per branch."""
        return torch.arange(self.width) * self.depth + level - 1


def verify_tree_greedy(shape: TreeShape, nodes: list[int], choice: list[int]) -> tuple[list[int], int, int]:
    """One request. nodes: the N drafted tokens; choice: the 1 + N target argmaxes after the root and
    after each node. Returns (accepted node indices along the path, accepted count, next token)."""
    path, parent_row = [], 0
    for branch in range(shape.width):
        if nodes[shape.node(branch, 1)] == choice[0]:
            for level in range(1, shape.depth + 1):
                n = shape.node(branch, level)
                if nodes[n] != choice[parent_row]:
                    break
                path.append(n)
                parent_row = 1 + n
            break
    return path, len(path), choice[parent_row]


def verify_tree_stochastic(shape: TreeShape, nodes: list[int], target_probs: Tensor, draft_probs: Tensor | None,
                           generator: torch.Generator | None) -> tuple[list[int], int, int]:
    """One request. nodes: the N drafted tokens; target_probs [1 + N, V] after the root and each node; draft_probs
    [N, V], the distribution each node was drawn from (None: deterministic candidates, one-hot).
    Returns (accepted node indices along the path, accepted count, next token)."""
    path: list[int] = []
    p = target_probs[0]
    children = [shape.node(b, 1) for b in range(shape.width)]
    while children:
        chosen = None
        for n in children:
            token = nodes[n]
            q = draft_probs[n] if draft_probs is not None else _one_hot(token, p)
            u = float(torch.rand((), generator=generator, device=p.device))
            if u * float(q[token]) < float(p[token]):     # u < p/q without dividing by a zero q
                chosen = n
                break
            residual = (p - q).clamp_min(0)
            mass = residual.sum()
            # p == q exactly leaves no residual; this child was then accepted surely, so this
            # branch is unreachable with probability > 0: keep p.
            p = residual / mass if mass > 0 else p
        if chosen is None:
            break
        path.append(chosen)
        p = target_probs[1 + chosen]
        level = int(shape.levels[chosen])
        children = [chosen + 1] if level < shape.depth else []
    return path, len(path), int(sample(p, generator))


def _one_hot(token: int, like: Tensor) -> Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q
