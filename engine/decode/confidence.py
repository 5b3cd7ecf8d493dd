"""Is the drafter calibrated? Acceptance of drafts binned by the drafter's own confidence.

A draft is judged when every draft before it in its round was accepted (positions
0..accepted of the round); it is accepted when its position is below `accepted`. A
calibrated drafter's drafts at confidence p are accepted about p of the time (greedy).
A copy's drafts (--lookup) are certain by construction (draft_p 1), not a drafter's
confidence: they are left out. Plain Python over round events or trace records.
"""

from __future__ import annotations

from typing import Any, Iterable

from engine.decode.events import LOOKUP, field_of

BINS = 10


def calibration(rounds: Iterable[Any], bins: int = BINS) -> list[tuple[float, float, int]]:
    """(mean drafter confidence, acceptance rate, drafts) per non-empty confidence bin, lowest first."""
    sums = [[0.0, 0, 0] for _ in range(bins)]  # confidence sum, accepted, judged
    for r in rounds:
        if field_of(r, "source") == LOOKUP:
            continue
        draft_p, accepted = field_of(r, "draft_p") or [], field_of(r, "accepted", 0)
        for i, p in enumerate(draft_p[: accepted + 1]):
            b = sums[min(int(p * bins), bins - 1)]
            b[0] += p
            b[1] += i < accepted
            b[2] += 1
    return [(s / n, a / n, n) for s, a, n in sums if n]


def broke_at(r: Any) -> dict[str, Any] | None:
    """Where round r's block broke and how sure each model was there; None when nothing broke."""
    drafted, accepted = field_of(r, "drafted") or [], field_of(r, "accepted", 0)
    draft_p = field_of(r, "draft_p") or []
    if accepted >= len(drafted) or accepted >= len(draft_p):
        return None
    return {
        "position": accepted + 1,  # 1-based draft position
        "draft": drafted[accepted],
        "target_choice": field_of(r, "bonus"),
        "draft_p": draft_p[accepted],
        "target_p": field_of(r, "target_p")[accepted],
        "margin": field_of(r, "margin")[accepted],
        "target_rank": field_of(r, "target_rank")[accepted],
    }
