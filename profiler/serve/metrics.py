"""An engine's speculative-decoding counters from its Prometheus /metrics endpoint.

vLLM counts (and llama.cpp's server, under the prefix `llamacpp:` and the same names), over the server's life, the draft proposals it verified (`num_drafts`), the tokens they
held (`num_draft_tokens`), the tokens accepted (`num_accepted_tokens`) and the accepted tokens per
draft position (`num_accepted_tokens_per_pos`, position 0 first). A run's counters are the
difference of two scrapes, one before its requests and one after.
"""
from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass, field

PREFIX = "vllm:spec_decode_"
LINE = re.compile(r'^(?P<name>[a-z_:]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$')


@dataclass
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: list[float] = field(default_factory=list)

    def minus(self, earlier: "SpecCounters") -> "SpecCounters":
        positions = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        mine = self.accepted_per_position + [0.0] * (positions - len(self.accepted_per_position))
        theirs = earlier.accepted_per_position + [0.0] * (positions - len(earlier.accepted_per_position))
        return SpecCounters(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                            self.accepted - earlier.accepted, [a - b for a, b in zip(mine, theirs)])

    def summary(self) -> dict:
        """The counters with the rates they give: acceptance per position (accepted at position i
        over drafts) and tokens committed per step that verified a draft (1 + accepted / drafts;
        steps where the drafter proposed nothing are not counted by vLLM)."""
        out = {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
               "accepted_per_position": self.accepted_per_position}
        if self.drafts:
            out["acceptance_per_position"] = [a / self.drafts for a in self.accepted_per_position]
            out["tokens_per_draft"] = 1.0 + self.accepted / self.drafts
            out["draft_acceptance_rate"] = self.accepted / self.draft_tokens if self.draft_tokens else None
        return out


def parse_spec_counters(text: str, prefix: str = PREFIX) -> SpecCounters:
    """The `_total` counters of a Prometheus text exposition, summed over label sets other than the
    position."""
    counters = SpecCounters()
    per_position: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        match = LINE.match(line.strip())
        if match is None or not match["name"].endswith("_total"):
            continue
        name = match["name"][len(prefix):-len("_total")]
        value = float(match["value"])
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        if name == "num_drafts":
            counters.drafts += value
        elif name == "num_draft_tokens":
            counters.draft_tokens += value
        elif name == "num_accepted_tokens":
            counters.accepted += value
        elif name == "num_accepted_tokens_per_pos" and "position" in labels:
            position = int(labels["position"])
            per_position[position] = per_position.get(position, 0.0) + value
    counters.accepted_per_position = [per_position.get(i, 0.0) for i in range(max(per_position, default=-1) + 1)]
    return counters


def scrape_spec_counters(url: str, prefix: str = PREFIX) -> SpecCounters:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        return parse_spec_counters(response.read().decode(), prefix)
