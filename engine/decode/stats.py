"""RoundStats: acceptance and round times over a run's DFlash rounds.

The one place tau, the acceptance histogram, per-position acceptance and mean round
times are computed: the run summary, `bench` and the window (app/run_record.py) all
read them from here. Plain Python, grown one round at a time, so a live view and a
finished run agree.

Auto's plain steps (bonus_kind "plain": the drafter skipped, one token from the target) are
round events too, for the rounds view and the plots, but they are no rounds: they are counted
apart, and round counts and mean round times are over the rounds that ran a verify.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable, Optional

from engine.decode.events import PLAIN, RoundEvent


def _mean(values: list[float]) -> Optional[float]:
    return round(statistics.fmean(values), 4) if values else None


@dataclass
class RoundStats:
    rounds: int = 0  # round events that were real rounds (not plain steps)
    plain_steps: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)  # accepted + 1, rounds that drafted
    histogram: list[int] = field(default_factory=list)  # rounds that drafted, by drafts accepted
    offered: list[int] = field(default_factory=list)  # per block position 1..: rounds that drafted it
    reached: list[int] = field(default_factory=list)  # ...and had it accepted
    # per round event, plain steps included (the plots draw every event):
    draft_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    rollback_ms: list[float] = field(default_factory=list)
    plain: list[bool] = field(default_factory=list)
    round_wall_ms: list[float] = field(default_factory=list)  # each real round's wall time, end to end
    _last_t: float = 0.0

    @classmethod
    def of(cls, rounds: Iterable[RoundEvent]) -> "RoundStats":
        stats = cls()
        for r in rounds:
            stats.add(r)
        return stats

    def add(self, r: RoundEvent) -> None:
        before = 0.0 if r.index == 0 else self._last_t  # index 0: a run's first round (bench pools runs)
        wall, self._last_t = 1000.0 * max(r.t - before, 0.0), r.t
        self.draft_ms.append(r.draft_ms)
        self.verify_ms.append(r.verify_ms)
        self.rollback_ms.append(r.rollback_ms)
        self.plain.append(r.bonus_kind == PLAIN)
        if self.plain[-1]:
            self.plain_steps += 1
            return
        self.rounds += 1
        self.round_wall_ms.append(wall)
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

    def _of_rounds(self, values: list[float]) -> list[float]:
        return [v for v, plain in zip(values, self.plain) if not plain]

    @property
    def mean_draft_ms(self) -> Optional[float]:
        return _mean(self._of_rounds(self.draft_ms))

    @property
    def mean_verify_ms(self) -> Optional[float]:
        return _mean(self._of_rounds(self.verify_ms))

    @property
    def mean_rollback_ms(self) -> Optional[float]:
        return _mean(self._of_rounds(self.rollback_ms))

    @property
    def mean_round_ms(self) -> Optional[float]:
        """A real round's wall time (draft, verify, rollback and bookkeeping), plain steps left out."""
        return _mean(self.round_wall_ms)
