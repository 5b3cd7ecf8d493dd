"""RoundStats: acceptance and round times over a run's DFlash rounds.

The one place tau, the acceptance histogram, per-position acceptance and mean round
times are computed: the run summary, `bench` and the window (app/run_record.py) all
read them from here. Plain Python, grown one round at a time, so a live view and a
finished run agree.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional

from engine.decode.events import RoundEvent


def _mean(values: list[float]) -> Optional[float]:
    return round(statistics.fmean(values), 4) if values else None


@dataclass
class RoundStats:
    rounds: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)  # accepted + 1, rounds that drafted
    histogram: list[int] = field(default_factory=list)  # rounds that drafted, by drafts accepted
    offered: list[int] = field(default_factory=list)  # per block position 1..: rounds that drafted it
    reached: list[int] = field(default_factory=list)  # ...and had it accepted
    draft_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    rollback_ms: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, rounds: Iterable[RoundEvent]) -> "RoundStats":
        stats = cls()
        for r in rounds:
            stats.add(r)
        return stats

    def add(self, r: RoundEvent) -> None:
        self.rounds += 1
        self.draft_ms.append(r.draft_ms)
        self.verify_ms.append(r.verify_ms)
        self.rollback_ms.append(r.rollback_ms)
        n = len(r.drafted)
        if not n:
            return  # a block of one (the last token, or block size 1) drafts nothing
        self.acceptance_lengths.append(r.accepted + 1)
        grow = max(n + 1 - len(self.histogram), 0)
        self.histogram += [0] * grow
        self.histogram[r.accepted] += 1
        grow = max(n - len(self.offered), 0)
        self.offered += [0] * grow
        self.reached += [0] * grow
        for k in range(n):
            self.offered[k] += 1
            self.reached[k] += r.accepted > k

    @property
    def tau(self) -> Optional[float]:
        """Mean acceptance length, the bonus token counted (as vLLM counts it)."""
        return _mean(self.acceptance_lengths)

    def histogram_of(self, block: int) -> list[int]:
        """The histogram over 0..block-1 accepted drafts."""
        return (self.histogram + [0] * block)[:block]

    @property
    def per_position_acceptance(self) -> list[float]:
        """Per block position k = 1..: the share of rounds that drafted position k and had it accepted."""
        return [round(a / o, 4) if o else 0.0 for a, o in zip(self.reached, self.offered)]

    @property
    def mean_draft_ms(self) -> Optional[float]:
        return _mean(self.draft_ms)

    @property
    def mean_verify_ms(self) -> Optional[float]:
        return _mean(self.verify_ms)

    @property
    def mean_rollback_ms(self) -> Optional[float]:
        return _mean(self.rollback_ms)
