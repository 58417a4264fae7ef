"""Speculative decoding on the torch Llama: one engine loop for every method, every step recorded.

One engine step for a batch of requests, each at its own position p (its last committed token,
the root, whose KV is not written yet):
  1. the drafter fills a static tree below each root (a chain of k is the tree 1 x k);
  2. one target forward runs [root, nodes] (node n at cache slot p + 1 + n, rotary position
     p + its level, attending its ancestors), writing their KV;
  3. each request keeps the longest path of drafts the target agrees with (greedy match, or
     rejection sampling with a temperature), plus the target's own next token, moves the accepted
     nodes' KV to consecutive positions, and advances.
Rejected drafts need no rollback: their KV sits past the request's position, where no query looks
until a later step overwrites it. Greedy verification is lossless: the output is the target's
greedy output token for token. How requests arrive, prefill, join and leave the batch is the
serving loop's (profiler.engine.serving: static batches or continuous batching).

SpecPV (`partial`): once a request's context exceeds sink + budget + window, it verifies against
a partial KV cache (profiler.engine.partial) and every `period` tokens (or steps) runs a full
verification instead, re-feeding the tokens accepted since the last refresh through full
attention and taking new block summaries. With `rectify` that full verification also re-checks
those tokens and rolls back at the first disagreement, and a request's last tokens are checked
before it finishes: the output is then the target's own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from profiler.engine.drafters import DraftInput, Drafter
from profiler.engine.graphs import forward_new_tokens
from profiler.engine.model import KernelLayout, Llama, add_tree_edges, context_mask
from profiler.engine.partial import PartialSpec, PartialStep
from profiler.engine.sampling import probs_from_logits, sample, verify_chain
from profiler.engine.tree import TreeShape, verify_tree_greedy, verify_tree_stochastic


@dataclass(frozen=True)
class Sampler:
    """Temperature > 0 with nucleus filtering; greedy decoding uses no Sampler."""
    temperature: float
    top_p: float = 1.0
    generator: torch.Generator | None = None

    def probs(self, logits: Tensor) -> Tensor:
        return probs_from_logits(logits, self.temperature, self.top_p)

    def draw(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        probs = self.probs(logits)
        return sample(probs, self.generator), probs


@dataclass(kw_only=True)
class StepRecord:
    step: int
    request: int
    mode: str
    query_tokens: int
    kv_tokens: int
    drafted: int
    accepted: int
    committed: int
    accept_flags: list[bool]
    draft_s: float
    verify_s: float
    other_s: float
    selection_s: float = 0.0
    refed: int = 0                 # SpecPV full verification: tokens re-fed through full attention
    rolled_back: int = 0           # SpecPV rectify: committed tokens discarded at this step
    end_s: float = 0.0             # when the step's tokens were committed, since the run's start


@dataclass
class Generation:
    outputs: list[list[int]]
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


@dataclass
class RequestState:
    """One request's running state in the engine."""
    request: int                   # index in the prompts given
    history: list[int]             # prompt + output; the token at position q is history[q]
    prompt_tokens: int
    refresh: int | None = None     # SpecPV: position of the last refresh (None: never refreshed)
    steps_since: int = 0           # SpecPV: partial steps since the refresh
    final_check: bool = False      # SpecPV rectify: complete, but its last tokens are unchecked

    @property
    def position(self) -> int:
        return len(self.history) - 1

    @property
    def output(self) -> list[int]:
        return self.history[self.prompt_tokens:]


def device_sync(device: torch.device):
    """What a phase's clock waits on: the GPU's queue on CUDA, nothing on the CPU."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def refeed_room(partial: PartialSpec | None, nodes_per_step: int) -> int:
    """Cache slots a row needs past its tokens for the padding of a step whose rows re-feed
    different numbers of tokens (SpecPV: up to a period's worth, placed after each row's own)."""
    if partial is None:
        return 0
    return partial.period * (nodes_per_step + 1) if partial.period_unit == "steps" else partial.period + nodes_per_step + 1


def run_step(model: Llama, alive: list[RequestState], drafter: Drafter | None, shape: TreeShape | None,
             sampler: Sampler | None, partial: PartialSpec | None, max_new_tokens: int, eos_id: int | None, step: int,
             use_kernels: bool, start: float, reader: Drafter | None = None) -> list[StepRecord]:
    """One engine step of the requests decoding in cache rows 0..len(alive) - 1: draft, verify in
    one target forward, commit each request's accepted tokens (its history grows), move the
    accepted tree nodes' KV, refresh SpecPV summaries. Returns a record per request; `start`: the
    clock the records' end_s counts from. reader: a drafter that reads the target's hidden states
    (EAGLE) gets those of the committed positions, even at a step it did not draft."""
    device = model.lm_head.weight.device
    sync = device_sync(device)
    nodes_per_step = shape.nodes if shape is not None else 0
    t0 = time.perf_counter()
    roots = torch.tensor([(r.position, r.history[-1]) for r in alive], device=device)          # [M, 2]: one copy
    positions, last = roots[:, 0], roots[:, 1]
    modes = [_mode(r, drafter, partial) for r in alive]
    nodes, node_probs = (drafter.propose(DraftInput(model, [r.history for r in alive], last, positions, shape,
                                                    [r.prompt_tokens for r in alive], use_kernels),
                                         sampler) if drafter is not None else (None, None))
    if nodes is not None:
        nodes = nodes.to(device)
    sync()
    t1 = time.perf_counter()
    if use_kernels and all(m in ("decode", "verify") for m in modes):
        # Every row the same T new tokens at consecutive slots: the attention kernel's layout, built
        # on the device (no host round trip), and replayed from a CUDA graph when the model has them.
        layout = _lay_out_uniform_step(alive, positions, last, nodes, shape)
        logits = forward_new_tokens(model, layout.tokens, layout.positions, layout.slots, layout.kernel,
                                    layout.logits_at)                                               # [M, T, V]
        verify_logits = logits
    else:
        layout = _lay_out_step(alive, modes, None if nodes is None else nodes.cpu(), shape, partial, device,
                               use_kernels)
        logits = model(layout.tokens, layout.positions, mask=layout.mask, slots=layout.slots,
                       logits_at=layout.logits_at, partial=layout.partial, kernel=layout.kernel)   # [M, L, V]
        at = (torch.tensor(layout.verify_from)[:, None] + torch.arange(1 + nodes_per_step)).to(device)
        verify_logits = logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1]))      # [M, 1 + N, V]
    sync()
    t2 = time.perf_counter()
    selection_s = layout.partial.selection_s if layout.partial is not None else 0.0
    moves, refreshed, records, hidden = [], [], [], []
    if shape is None or shape.width == 1:
        chains, node_lists = _verify_chains(verify_logits, nodes, sampler, node_probs)
    else:
        chains, node_lists = None, nodes.tolist()
    for b, r in enumerate(alive):
        rolled_back = _rectify(r, logits[b]) if modes[b] == "full" and partial.rectify else 0
        if rolled_back:
            new, path, flags = [], [], [False] * nodes_per_step
            r.final_check = False
        else:
            if chains is not None:
                path, flags, following = chains[b]
            else:
                path, flags, following = _verify_tree(verify_logits[b], node_lists[b], shape, sampler,
                                                      None if node_probs is None else node_probs[b])
            new = [] if r.final_check else [node_lists[b][n] for n in path] + [following]
            new = _truncate(new, r.output, max_new_tokens, eos_id)
            root = r.position
            moves += [(b, root + 1 + n, root + 1 + i) for i, n in enumerate(path[:len(new)]) if n != i]
            r.history.extend(new)
        if reader is not None and reader.reads_hidden:
            # Committed positions whose states this forward computed: the re-fed tokens, the root,
            # and the accepted nodes (those of a rolled-back row only up to its new root).
            o = layout.refed[b]
            first = r.refresh if rolled_back else r.position - len(new) - o
            at_layout = list(range(o + 1)) + [o + 1 + n for n in path]
            hidden.append((b, first, at_layout[:max(0, min(len(at_layout), r.position - first))]))
        if modes[b] == "full":
            refreshed.append(b)
        elif modes[b] == "partial":
            r.steps_since += 1
        records.append(StepRecord(
            step=step, request=r.request, mode=modes[b], query_tokens=layout.query_tokens[b],
            kv_tokens=layout.kv_tokens[b], drafted=nodes_per_step, accepted=len(path),
            committed=1 - rolled_back if rolled_back else len(new), accept_flags=flags, draft_s=t1 - t0,
            verify_s=t2 - t1 - selection_s, other_s=0.0, refed=layout.refed[b], rolled_back=rolled_back))
    if hidden:
        reader.take_hidden(model.kept_hidden, hidden)
    if moves:
        rows, source, target = (torch.tensor(column, device=device) for column in zip(*moves))
        model.move_kv(rows, source, target)
        drafter.move_kv(rows, source, target)
    sync()
    t3 = time.perf_counter()
    if refreshed:
        for b in refreshed:
            alive[b].refresh, alive[b].steps_since = alive[b].position, 0
        rows = torch.tensor(refreshed, device=device)
        model.refresh_summaries(rows, torch.tensor([alive[b].position for b in refreshed], device=device),
                                partial.block)
    sync()
    t4 = time.perf_counter()
    for record in records:
        record.selection_s = selection_s + (t4 - t3)
        record.other_s = t3 - t2
        record.end_s = t4 - start
    return records


def _mode(r: RequestState, drafter: Drafter | None, partial: PartialSpec | None) -> str:
    """decode (no drafter), verify (full attention), or SpecPV's partial / full verification."""
    if drafter is None:
        return "decode"
    if partial is None or r.position <= partial.static_tokens:
        return "verify"
    since = r.position - r.refresh if r.refresh is not None else 0
    due = since >= partial.period if partial.period_unit == "tokens" else r.steps_since >= partial.period
    return "full" if r.refresh is None or due or r.final_check else "partial"


def _lay_out_uniform_step(alive: list[RequestState], positions: Tensor, last: Tensor, nodes: Tensor | None,
                          shape: TreeShape | None) -> "StepLayout":
    """A step whose every row is [root, tree nodes] (decode, or verification without SpecPV's
    modes), laid out on the device for the attention kernel: row b's T new tokens at slots
    p_b .. p_b + T - 1, kv_len p_b + T, the tree's mask among them. positions, last: [M]."""
    n_nodes = shape.nodes if nodes is not None else 0
    T = 1 + n_nodes
    offsets, tree_mask, columns = _uniform_constants(shape if nodes is not None else None, positions.device)
    M = positions.shape[0]
    tokens = last[:, None] if nodes is None else torch.cat([last[:, None], nodes], dim=1)      # [M, T]
    kernel = KernelLayout((positions + T).to(torch.int32), tree_mask.expand(M, T, T))
    layout = StepLayout(tokens, positions[:, None] + offsets, positions[:, None] + columns, None,
                        columns.expand(M, T), [0] * M, [T] * M, [r.position + T for r in alive], [0] * M, None,
                        kernel)
    return layout


_UNIFORM: dict = {}


def _uniform_constants(shape: TreeShape | None, device) -> tuple[Tensor, Tensor, Tensor]:
    """Per tree shape, on the device: rotary offsets [T] (root 0, node n its level), the mask
    among the new tokens [T, T] (the root sees itself, a node the root and its ancestors) and
    0..T-1, made once."""
    key = (shape, str(device))
    if key not in _UNIFORM:
        T = 1 + (shape.nodes if shape is not None else 0)
        mask = torch.zeros(T, T, dtype=torch.bool)
        mask[:, 0] = True
        offsets = torch.zeros(T, dtype=torch.long)
        if shape is not None:
            mask[1:, 1:] = shape.ancestors
            offsets[1:] = shape.levels
        _UNIFORM[key] = (offsets.to(device), mask.to(device), torch.arange(T, device=device))
    return _UNIFORM[key]


@dataclass
class StepLayout:
    """One target forward over a ragged batch, padded to T tokens per row."""
    tokens: Tensor            # [M, T]
    positions: Tensor         # [M, T] rotary positions
    slots: Tensor             # [M, T] cache slots (padding writes to the trash slot)
    mask: Tensor | None       # [M, 1, T, S] (None: the kernel's layout alone)
    logits_at: Tensor         # [M, L] which tokens' logits come back
    verify_from: list[int]    # per row: index in the returned logits of the root's
    query_tokens: list[int]
    kv_tokens: list[int]
    refed: list[int]
    partial: PartialStep | None
    kernel: KernelLayout | None       # on CUDA: the step as spec_kernels.attention takes it


def _lay_out_step(alive: list[RequestState], modes: list[str], nodes: Tensor | None, shape: TreeShape | None,
                  partial: PartialSpec | None, device: torch.device, use_kernels: bool) -> StepLayout:
    """Per row: [re-fed tokens (full verification), root, tree nodes]; built on the host, then
    moved to the model's device."""
    M = len(alive)
    n_nodes = shape.nodes if nodes is not None else 0
    refeed = [r.history[r.refresh:r.position] if m == "full" and r.refresh is not None else []
              for r, m in zip(alive, modes)]
    lengths = [len(f) + 1 + n_nodes for f in refeed]
    T = max(lengths)
    tokens = torch.zeros(M, T, dtype=torch.long)
    positions = torch.zeros(M, T, dtype=torch.long)
    slots = torch.zeros(M, T, dtype=torch.long)
    context_end = torch.zeros(M, T, dtype=torch.long)      # padding sees slot 0 only: no empty softmax
    first_logit, kv_tokens = [], []
    rectify = partial is not None and partial.rectify
    for b, (r, m, f) in enumerate(zip(alive, modes, refeed)):
        p, o = r.position, len(f)
        span = torch.arange(p - o, p + 1)
        tokens[b, :o + 1] = torch.tensor(f + [r.history[-1]])
        positions[b, :o + 1] = slots[b, :o + 1] = context_end[b, :o + 1] = span
        if n_nodes:
            tokens[b, o + 1:o + 1 + n_nodes] = nodes[b]
            positions[b, o + 1:o + 1 + n_nodes] = p + shape.levels
            slots[b, o + 1:o + 1 + n_nodes] = p + 1 + torch.arange(n_nodes)
            context_end[b, o + 1:o + 1 + n_nodes] = p
        # Padding goes to the slots right after the row's own tokens (past its position: no query
        # looks there, a later step overwrites them), so every row's T tokens are consecutive.
        pad = T - lengths[b]
        slots[b, lengths[b]:] = p + 1 + n_nodes + torch.arange(pad)
        first_logit.append(0 if m == "full" and rectify else o)
        kv_tokens.append(p + 1 + n_nodes)
    S = int(slots.max()) + 1
    mask = context_mask(context_end, positions, S)
    if n_nodes:
        offsets = torch.tensor([len(f) + 1 for f in refeed])[:, None]
        roots = torch.tensor([r.position for r in alive])[:, None]
        mask = add_tree_edges(mask, offsets + torch.arange(n_nodes), roots + 1 + torch.arange(n_nodes),
                              shape.ancestors)
    L = max(n - f for n, f in zip(lengths, first_logit))
    logits_at = torch.tensor([[min(f + i, n - 1) for i in range(L)] for n, f in zip(lengths, first_logit)])
    step = None
    partial_rows = [b for b, m in enumerate(modes) if m == "partial"]
    if partial_rows:
        refresh = torch.tensor([alive[b].refresh for b in partial_rows])
        ends = torch.tensor([alive[b].position + 1 + n_nodes for b in partial_rows])
        query_valid = torch.arange(T)[None, :] < torch.tensor([lengths[b] for b in partial_rows])[:, None]
        step = PartialStep(partial, torch.tensor(partial_rows, device=device), (refresh - partial.window).to(device),
                           ends.to(device), query_valid.to(device))
        for i, b in enumerate(partial_rows):
            window_start = int(refresh[i]) - partial.window
            candidates = max(0, window_start // partial.block - -(-partial.sink // partial.block))
            kv_tokens[b] = (partial.sink + min(candidates, partial.budget_blocks) * partial.block
                            + int(ends[i]) - window_start)
    kernel = None
    if use_kernels:
        starts = torch.tensor([r.position - len(f) for r, f in zip(alive, refeed)])
        new_slots = starts[:, None] + torch.arange(T)
        tree_mask = mask[:, 0].gather(2, new_slots[:, None, :].expand(M, T, T))
        kernel = KernelLayout((starts + T).to(device=device, dtype=torch.int32), tree_mask.to(device))
    tokens, positions, slots, mask, logits_at = (t.to(device) for t in (tokens, positions, slots, mask, logits_at))
    return StepLayout(tokens, positions, slots, mask, logits_at,
                      [o - f for o, f in zip((len(f) for f in refeed), first_logit)], lengths, kv_tokens,
                      [len(f) for f in refeed], step, kernel)


def _verify_chains(rows: Tensor, nodes: Tensor | None, sampler: Sampler | None,
                   node_probs: Tensor | None) -> tuple[list[tuple[list[int], list[bool], int]], list[list[int]] | None]:
    """Chains (or plain decoding), the whole batch at once. rows [M, 1 + k, V]: target logits
    after the root and each draft. Per request: (accepted node indices, per-position accept
    flags, the target's next token); and the drafted tokens as lists. One read-back from the
    device for all of it."""
    if nodes is None:
        following = rows[:, 0].argmax(-1) if sampler is None else sampler.draw(rows[:, 0])[0]
        return [([], [], t) for t in following.tolist()], None
    if sampler is None:
        choice = rows.argmax(-1)                                                    # [M, 1 + k]
        flags = nodes == choice[:, :-1]
        accepted = flags.long().cumprod(dim=1).sum(dim=1)                           # longest matching prefix
        following = choice.gather(1, accepted[:, None])[:, 0]
    else:
        flags, accepted, following = verify_chain(sampler.probs(rows), nodes, node_probs, sampler.generator)
    k = nodes.shape[1]
    packed = torch.cat([accepted[:, None], following[:, None], flags.long(), nodes.long()], dim=1).tolist()
    chains = [(list(range(row[0])), [bool(f) for f in row[2:2 + k]], row[1]) for row in packed]
    return chains, [row[2 + k:] for row in packed]


def _verify_tree(rows: Tensor, nodes: list[int], shape: TreeShape, sampler: Sampler | None,
                 node_probs: Tensor | None) -> tuple[list[int], list[bool], int]:
    """One request's tree. rows [1 + N, V]: target logits after the root and each node."""
    if sampler is None:
        path, n, following = verify_tree_greedy(shape, nodes, rows.argmax(-1).tolist())
    else:
        path, n, following = verify_tree_stochastic(shape, nodes, sampler.probs(rows), node_probs, sampler.generator)
    return path, [True] * n + [False] * (shape.depth - n), following


def _rectify(r: RequestState, logits: Tensor) -> int:
    """SpecPV rectify at a full verification: the re-fed tokens' full-attention choices against
    what was committed after the refresh. Rolls the history back to the first disagreement and
    commits the target's token there; returns how many committed tokens were discarded."""
    if r.refresh is None:
        return 0
    refreshed_at = r.refresh
    checked = r.history[refreshed_at + 1:r.position + 1]          # chosen under partial attention
    choice = logits[:len(checked)].argmax(-1).tolist()
    bad = next((i for i, (c, t) in enumerate(zip(choice, checked)) if c != t), None)
    if bad is None:
        return 0
    keep = refreshed_at + 1 + bad
    discarded = len(r.history) - keep
    del r.history[keep:]
    r.history.append(choice[bad])
    return discarded


def output_complete(output: list[int], max_new_tokens: int, eos_id: int | None) -> bool:
    return len(output) >= max_new_tokens or (eos_id is not None and bool(output) and output[-1] == eos_id)


def _truncate(new: list[int], output: list[int], max_new_tokens: int, eos_id: int | None) -> list[int]:
    """Keep what the request may still emit: up to max_new_tokens, and nothing after EOS."""
    new = new[:max_new_tokens - len(output)]
    if eos_id is not None and eos_id in new:
        new = new[:new.index(eos_id) + 1]
    return new
