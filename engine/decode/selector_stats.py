"""The DFlash2 candidate selector at work: per drafted position, and over a run.

A DFlash2 round carries, per verified draft i: the selector's K candidates (best selector score
first), their scores, the rank of the target's own (argmax) choice among them (-1: not a
candidate) and the drafter head's plain argmax. From these:

- `positions(r)`: one row per verified draft, for a round's details;
- `miss(r)`: whose miss the round's first rejected draft was: "drafter" (the target's choice was
  not among the candidates), "selector" (it was, and the selector drafted another), or
  "sampling" (the draft was the target's choice, rejected by a draw at T > 0);
- `selector_stats(rounds)`: over a run, where the target's choice ranked and how often the
  selector's rescoring changed the plain argmax, and with what result.

Run statistics count the judged drafts: those the target saw after a fully accepted prefix
(positions 0..accepted of each round), as engine/decode/calibration.py does. Drafts after the
first rejection were scored against a wrong prefix and never reached the output.
Plain Python over round events or trace records; v1 rounds carry no candidates and give None.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from engine.decode.events import field_of


def has_selector(r: Any) -> bool:
    """Whether round r carries the selector's candidates (DFlash2 rounds that drafted)."""
    return bool(field_of(r, "candidates"))


def _verified(r: Any) -> int:
    """How many drafts carry every selector field (all of them, in any trace written whole)."""
    return min(len(field_of(r, name) or []) for name in
               ("drafted", "candidates", "candidate_scores", "target_candidate_rank", "plain_top"))


def positions(r: Any) -> list[dict[str, Any]]:
    """Per verified draft of a DFlash2 round: its candidates and what became of them ([] for v1)."""
    drafted, accepted = field_of(r, "drafted") or [], field_of(r, "accepted", 0)
    candidates, scores = field_of(r, "candidates") or [], field_of(r, "candidate_scores") or []
    ranks, plain = field_of(r, "target_candidate_rank") or [], field_of(r, "plain_top") or []
    rows = []
    for i in range(_verified(r)):
        ids, rank = candidates[i], ranks[i]
        rows.append({
            "position": i + 1,  # 1-based draft position in the block
            "drafted": drafted[i],
            "drafted_rank": ids.index(drafted[i]) if drafted[i] in ids else -1,
            "plain_top": plain[i],
            "rescored": plain[i] != drafted[i],  # the selector's rescoring changed the head's pick
            "candidates": list(zip(ids, scores[i])),
            "target_rank": rank,
            "target_choice": ids[rank] if 0 <= rank < len(ids) else None,
            "status": "accepted" if i < accepted else "rejected" if i == accepted else "after the break",
        })
    return rows


def miss(r: Any) -> Optional[dict[str, Any]]:
    """The first rejected draft of a DFlash2 round and whose miss it was; None when none was rejected."""
    rows = positions(r)
    accepted = field_of(r, "accepted", 0)
    if accepted >= len(rows):
        return None
    row = rows[accepted]
    if row["target_rank"] < 0:
        kind = "drafter"
    elif row["target_choice"] != row["drafted"]:
        kind = "selector"
    else:
        kind = "sampling"
    return {**row, "kind": kind}


def top_k(rounds: Iterable[Any]) -> int:
    """K: the most candidates any verified draft of these rounds carries (0 for v1 runs)."""
    return max((len(c) for r in rounds for c in field_of(r, "candidates") or []), default=0)


def selector_stats(rounds: Iterable[Any]) -> Optional[dict[str, Any]]:
    """Over the judged drafts of a run's DFlash2 rounds; None when no round carries candidates.

    rank_counts[k]: drafts where the target's choice was the k-th best candidate (0 = best);
    not_candidate: where it was none of them. rescored: drafts where the selector drafted
    something other than the head's plain argmax; rescored_accepted: of those, accepted;
    rescored_plain_was_target: of those, the plain argmax was the target's choice (the rescoring
    cost the draft). kept / kept_accepted: the drafts that stayed the plain argmax. misses: the
    rounds' first rejected drafts by whose miss they were (see `miss`).
    """
    rounds = [r for r in rounds if has_selector(r)]
    if not rounds:
        return None
    k = top_k(rounds)
    out = {"top_k": k, "rounds": len(rounds), "judged": 0, "rank_counts": [0] * k, "not_candidate": 0,
           "rescored": 0, "rescored_accepted": 0, "rescored_plain_was_target": 0, "kept": 0, "kept_accepted": 0,
           "misses": {"drafter": 0, "selector": 0, "sampling": 0}}
    for r in rounds:
        accepted = field_of(r, "accepted", 0)
        for row in positions(r)[: accepted + 1]:
            out["judged"] += 1
            rank = row["target_rank"]
            if 0 <= rank < k:
                out["rank_counts"][rank] += 1
            else:
                out["not_candidate"] += 1
            ok = row["status"] == "accepted"
            if row["rescored"]:
                out["rescored"] += 1
                out["rescored_accepted"] += ok
                out["rescored_plain_was_target"] += row["target_choice"] == row["plain_top"]
            else:
                out["kept"] += 1
                out["kept_accepted"] += ok
        broke = miss(r)
        if broke is not None:
            out["misses"][broke["kind"]] += 1
    return out
