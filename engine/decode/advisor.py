"""The block-size advisor: what every verify length would have given on this run, here.

From one run's rounds (live or from a trace) and the machine's cost curve
(engine/decode/cost_curve.py) it predicts, for each block size k = 1..block, the tokens a
round commits and what a round costs:

    E(k)  = 1 + sum_{i < k} a_1 * ... * a_i        (a_j: draft j accepted once 1..j-1 were)
    ms(k) = curve.round_ms(k) + overhead    (a fixed size k drafts only k; auto drafts the whole block)

a_j is counted over the rounds that verified draft j, so a run at any block size (or auto)
informs the lengths it reached. `overhead` is what this run's rounds cost beyond the curve's
draft and verify (rollback, sampling, bookkeeping): the run's measured decode time per round
minus the curve's time for the lengths it verified. Auto is predicted as the best length when
the whole block is drafted every round (as auto does), which its controller aims for.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from engine.decode.cost_curve import CostCurve

PRIOR = (0.5, 1.0)  # accepted, offered: an unseen position counts as a coin flip, weakly


@dataclass(frozen=True)
class Advice:
    lengths: list[int]  # 1..block
    committed: list[float]  # E(k) per round
    round_ms: list[float]  # ms(k)
    tok_s: list[float]
    speedup: list[float]  # against ar_tok_s
    ar_tok_s: float
    overhead_ms: float
    rounds: int
    auto_tok_s: float

    @property
    def auto_speedup(self) -> float:
        return round(self.auto_tok_s / self.ar_tok_s, 4)

    @property
    def best(self) -> int:
        return self.lengths[self.tok_s.index(max(self.tok_s))]

    def speedup_at(self, length: int) -> float:
        return self.speedup[min(length, len(self.lengths)) - 1]

    def to_dict(self) -> dict[str, Any]:
        return {"lengths": self.lengths, "committed": self.committed, "round_ms": self.round_ms,
                "tok_s": self.tok_s, "speedup": self.speedup, "ar_tok_s": self.ar_tok_s,
                "overhead_ms": self.overhead_ms, "rounds": self.rounds, "best": self.best,
                "auto_tok_s": self.auto_tok_s, "auto_speedup": self.auto_speedup}


def _get(r: Any, name: str, default: Any = None) -> Any:
    return r.get(name, default) if isinstance(r, dict) else getattr(r, name, default)


def verified_of(r: Any) -> int:
    """Positions the target verified in round r (traces before `verified` existed: anchor + drafts)."""
    return _get(r, "verified") or len(_get(r, "drafted", [])) + 1


def acceptance_rates(rounds: Iterable[Any], block: int) -> list[float]:
    """a_j for j = 1..block-1 (round events or trace records)."""
    accepted, offered = [0] * (block - 1), [0] * (block - 1)
    for r in rounds:
        n, acc = len(_get(r, "drafted", [])), _get(r, "accepted", 0)
        for j in range(min(n, acc + 1, block - 1)):
            offered[j] += 1
            accepted[j] += j < acc
    return [(a + PRIOR[0]) / (o + PRIOR[1]) for a, o in zip(accepted, offered)]


def expected_committed(rates: list[float]) -> list[float]:
    """E(k) for k = 1..len(rates) + 1."""
    totals, total, reach = [1.0], 1.0, 1.0
    for a in rates:
        reach *= a
        total += reach
        totals.append(total)
    return totals


def advise(rounds: list[Any], decode_s: float, curve: CostCurve, ar_tok_s: Optional[float] = None,
           block: Optional[int] = None) -> Optional[Advice]:
    """Predictions for k = 1..block (default: the curve's), or None without rounds to learn from."""
    if not rounds or decode_s <= 0:
        return None
    block = min(block or curve.block, len(curve.verify_ms))
    auto_run = any(_get(r, "unverified") for r in rounds)  # auto drafts the whole block every round
    measured_ms = 1000.0 * decode_s / len(rounds)
    curve_ms = statistics.fmean(curve.round_ms(min(verified_of(r), block), whole_block=auto_run) for r in rounds)
    overhead = measured_ms - curve_ms
    committed = expected_committed(acceptance_rates(rounds, block))
    round_ms = [max(curve.round_ms(k, whole_block=False) + overhead, 1e-6) for k in range(1, block + 1)]
    tok_s = [1000.0 * e / ms for e, ms in zip(committed, round_ms)]
    auto_tok_s = max(1000.0 * e / max(curve.round_ms(k, whole_block=True) + overhead, 1e-6)
                     for k, e in enumerate(committed, 1))
    ar = ar_tok_s or 1000.0 / curve.ar_step_ms
    return Advice(
        lengths=list(range(1, block + 1)),
        committed=[round(e, 4) for e in committed],
        round_ms=[round(ms, 4) for ms in round_ms],
        tok_s=[round(t, 3) for t in tok_s],
        speedup=[round(t / ar, 4) for t in tok_s],
        ar_tok_s=round(ar, 3),
        overhead_ms=round(overhead, 4),
        rounds=len(rounds),
        auto_tok_s=round(auto_tok_s, 3),
    )
