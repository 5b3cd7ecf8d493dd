"""The block-size advisor: what every verify length would have given on this run, here.

From one run's rounds (live or from a trace) and the machine's cost curve
(engine/decode/cost_curve.py) it predicts, for each block size k = 1..block, the tokens a
round commits and what a round costs:

    ms(k) = draft_scale * draft(k) + verify_scale * verify(k) + overhead
            (a round of length k drafts only k, whether the size is fixed or auto's choice)

The tokens come from replaying the run: its rounds cut the output into streaks of tokens the
drafts got right, each ended by a correction. At block k a streak of s is committed by rounds
of k tokens while s >= k, then one round of s % k + 1 (the rest and the correction), taking the
run's own drafts as what a block-k drafter would have drafted there. Counting it that way
(rather than multiplying per-position acceptance rates) keeps the fact that a round which starts
inside a streak, as short blocks often do, starts at an easy position.

The curve's draft and verify times, at each round's context depth, are scaled by what this run's
rounds measured for the lengths they used (acceptance is evaluated with the verify); the
predictions price every length at the run's mean depth; and `overhead` is
the rest of a round (rollback, events, text): the run's decode time per round minus its
draft and verify times. Auto is predicted as the best fixed length, which its controller aims for.

The advice is about the drafter: rounds that verified a copy of the context (--lookup, source
"lookup") say nothing about its drafts or its block, so streaks and scales leave them out; only
the per-round overhead is taken over every round.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from engine.decode.cost_curve_data import CostCurve
from engine.decode.events import LOOKUP, field_of


@dataclass(frozen=True)
class Advice:
    lengths: list[int]  # 1..block
    committed: list[float]  # E(k) per round
    round_ms: list[float]  # ms(k)
    tok_s: list[float]
    speedup: list[float]  # against ar_tok_s
    ar_tok_s: float
    overhead_ms: float
    rounds: int  # the drafter's rounds it learnt from
    auto_tok_s: float
    copies: int = 0  # rounds that verified a copy of the context instead (--lookup), left out

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
                "auto_tok_s": self.auto_tok_s, "auto_speedup": self.auto_speedup, "copies": self.copies}


def from_drafter(r: Any) -> bool:
    """Whether round r's drafts were the drafter's, not a copy of the context (older traces have no
    source: every draft was the drafter's)."""
    return field_of(r, "source") != LOOKUP


def verified_of(r: Any) -> int:
    """Positions the target verified in round r (traces before `verified` existed: anchor + drafts)."""
    return field_of(r, "verified") or len(field_of(r, "drafted", [])) + 1


def streaks(rounds: Iterable[Any]) -> list[int]:
    """The run's streaks: tokens the drafts got right before each correction (a fully accepted
    block's bonus continues its streak into the next round)."""
    out, run = [], 0
    for r in rounds:
        if not field_of(r, "drafted"):
            continue  # nothing drafted (plain rounds, a run's last token): no evidence either way
        if not from_drafter(r):  # a copy was verified instead: the drafter was not asked there
            if run:
                out.append(run - 1)  # a streak cut short, as at the end of a run
            run = 0
            continue
        acc = field_of(r, "accepted", 0)
        if field_of(r, "bonus_kind") == "bonus":
            run += acc + 1
        else:
            out.append(run + acc)
            run = 0
    if run:
        out.append(run - 1)  # the run ended mid-streak: its last token stands in for a correction
    return out


def committed_per_round(streak_list: list[int], k: int) -> float:
    """Mean tokens a block-k round commits over these streaks (each streak of s is s + 1 tokens)."""
    tokens = sum(s + 1 for s in streak_list)
    rounds = sum(s // k + 1 for s in streak_list)
    return tokens / rounds if rounds else 1.0


def _ratio(run: float, curve: float) -> float:
    return run / curve if run > 0 and curve > 0 else 1.0


def advise(rounds: list[Any], decode_s: float, curve: CostCurve, ar_tok_s: Optional[float] = None,
           block: Optional[int] = None) -> Optional[Advice]:
    """Predictions for k = 1..block (default: the curve's), or None without rounds to learn from."""
    if not rounds or decode_s <= 0:
        return None
    # the rest of a round (rollback, events, text), over every round: the run's decode time per round
    # minus its draft and verify times
    every = len(rounds)
    overhead = (1000.0 * decode_s - sum(field_of(r, "draft_ms", 0.0) + field_of(r, "verify_ms", 0.0)
                                        for r in rounds)) / every
    rounds = [r for r in rounds if from_drafter(r)]
    if not rounds:
        return None
    block = min(block or curve.block, len(curve.verify_ms))
    auto_run = any(field_of(r, "unverified") for r in rounds)  # traces from when auto drafted whole blocks
    lengths = [min(verified_of(r), block) for r in rounds]
    # The run's own verify and draft times against the curve's for the same lengths at the same
    # depths: the run's verify also evaluates acceptance, so scale the curve by what the run saw.
    # What is left (rollback, events, text) is a per-round constant.
    depths = [field_of(r, "position", 0) for r in rounds]
    at = {d: curve.at(d) for d in set(depths)}
    verify_scale = _ratio(sum(field_of(r, "verify_ms", 0.0) for r in rounds),
                          sum(at[d].verify_ms[k - 1] for k, d in zip(lengths, depths)))
    draft_scale = _ratio(sum(field_of(r, "draft_ms", 0.0) for r, k in zip(rounds, lengths) if k > 1),
                         sum(at[d].draft_of(k, auto_run) for k, d in zip(lengths, depths) if k > 1))
    here = curve.at(round(statistics.fmean(depths)))  # every length priced at the run's mean depth

    def cost(k: int, whole_block: bool) -> float:
        return max(draft_scale * here.draft_of(k, whole_block) + verify_scale * here.verify_ms[k - 1]
                   + overhead, 1e-6)

    found = streaks(rounds)
    committed = [committed_per_round(found, k) for k in range(1, block + 1)]
    round_ms = [cost(k, False) for k in range(1, block + 1)]
    tok_s = [1000.0 * e / ms for e, ms in zip(committed, round_ms)]
    auto_tok_s = max(tok_s)
    ar = ar_tok_s or 1000.0 / here.ar_step_ms
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
        copies=every - len(rounds),
    )
