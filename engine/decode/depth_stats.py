"""Speed and acceptance by context depth: where in a long context DFlash gains or loses.

A long prompt moves every round deep into the context, where a verify's attention costs more
(against one row for an AR step) and a drafter trained on short windows drafts worse. These
bins put each round (by its anchor's position) and each AR token (by its own) in a range of
depths, with wall times from the events' clocks: a round lasts from the end of the one before to
its own end, an AR step from the token before to its own. `bench` prints them, the window's Why
tab plots them. Plain Python over events or trace records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from engine.decode.events import PLAIN, field_of

DEPTH_EDGES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def bin_of(depth: int) -> int:
    return sum(depth >= edge for edge in DEPTH_EDGES)


def bin_range(index: int) -> tuple[int, Optional[int]]:
    """(first depth, end or None) of bin `index`."""
    low = DEPTH_EDGES[index - 1] if index else 0
    return low, DEPTH_EDGES[index] if index < len(DEPTH_EDGES) else None


def bin_middle(index: int) -> float:
    """Where a plot puts bin `index`: its middle (the open last one: half past its start)."""
    low, high = bin_range(index)
    return (low + high) / 2 if high is not None else 1.5 * low


def bin_label(index: int) -> str:
    low, high = bin_range(index)
    return f"{low}-{high}" if high is not None else f"{low}+"


@dataclass
class DepthBin:
    index: int
    rounds: int = 0  # real rounds (auto's plain steps are counted apart)
    plain_steps: int = 0
    round_s: float = 0.0  # the real rounds' wall time
    drafting_rounds: int = 0  # rounds that drafted (tau counts these)
    acceptance_sum: int = 0  # accepted + 1 over the drafting rounds
    committed: int = 0
    dflash_s: float = 0.0
    ar_tokens: int = 0
    ar_s: float = 0.0
    round_depths: int = 0  # summed over the DFlash run's rounds and plain steps in the bin
    ar_depths: int = 0  # over the AR run's steps

    @property
    def label(self) -> str:
        return bin_label(self.index)

    @property
    def round_depth(self) -> float:
        """Where a plot puts the bin's DFlash figures: the mean depth of its rounds (a 1,400-token
        prompt's sit near 1,450, not at the middle of 1,024-2,048), else its middle."""
        n = self.rounds + self.plain_steps
        return self.round_depths / n if n else bin_middle(self.index)

    @property
    def ar_depth(self) -> float:
        """...and its AR figure: the mean depth of the AR steps."""
        return self.ar_depths / self.ar_tokens if self.ar_tokens else bin_middle(self.index)

    @property
    def tau(self) -> Optional[float]:
        return round(self.acceptance_sum / self.drafting_rounds, 4) if self.drafting_rounds else None

    @property
    def round_ms(self) -> Optional[float]:
        return round(1000.0 * self.round_s / self.rounds, 4) if self.rounds else None

    @property
    def dflash_tok_s(self) -> Optional[float]:
        return round(self.committed / self.dflash_s, 3) if self.dflash_s > 0 else None

    @property
    def ar_tok_s(self) -> Optional[float]:
        return round(self.ar_tokens / self.ar_s, 3) if self.ar_s > 0 else None

    @property
    def speedup(self) -> Optional[float]:
        df, ar = self.dflash_tok_s, self.ar_tok_s
        return round(df / ar, 4) if df and ar else None

    def to_dict(self) -> dict[str, Any]:
        return {"depth": self.label, "rounds": self.rounds, "plain_steps": self.plain_steps, "tau": self.tau,
                "round_ms": self.round_ms,
                "dflash_tok_s": self.dflash_tok_s, "ar_tok_s": self.ar_tok_s, "speedup": self.speedup}


def round_times(rounds: Iterable[Any]) -> list[tuple[int, float]]:
    """(anchor depth, seconds the round took) per round of one run, from the rounds' end times."""
    out, before = [], 0.0
    for r in rounds:
        t = field_of(r, "t", 0.0)
        out.append((field_of(r, "position", 0), max(t - before, 0.0)))
        before = t
    return out


def step_times(texts: Iterable[Any], prompt_tokens: int) -> list[tuple[int, float]]:
    """(depth, seconds) per AR step of one run, from its text events (one token each; the first, from
    the prefill, is no step)."""
    out, before, depth = [], None, prompt_tokens
    for e in texts:
        n = len(field_of(e, "token_ids") or [])
        if not n:
            continue
        t = field_of(e, "t", 0.0)
        if before is not None:
            out.append((depth, max(t - before, 0.0)))
        before, depth = t, depth + n
    return out


class DepthStats:
    """Bins grown run by run: DFlash rounds and AR steps, by depth."""

    def __init__(self):
        self.bins: dict[int, DepthBin] = {}

    def _bin(self, depth: int) -> DepthBin:
        i = bin_of(depth)
        return self.bins.setdefault(i, DepthBin(i))

    def add_rounds(self, rounds: list[Any]) -> None:
        for r, (depth, seconds) in zip(rounds, round_times(rounds)):
            b = self._bin(depth)
            b.round_depths += depth
            b.committed += len(field_of(r, "committed") or [])
            b.dflash_s += seconds
            if field_of(r, "bonus_kind") == PLAIN:
                b.plain_steps += 1
                continue
            b.rounds += 1
            b.round_s += seconds
            if field_of(r, "drafted"):
                b.drafting_rounds += 1
                b.acceptance_sum += field_of(r, "accepted", 0) + 1

    def add_steps(self, steps: list[tuple[int, float]]) -> None:
        for depth, seconds in steps:
            b = self._bin(depth)
            b.ar_depths += depth
            b.ar_tokens += 1
            b.ar_s += seconds

    def rows(self) -> list[DepthBin]:
        return [self.bins[i] for i in sorted(self.bins)]
