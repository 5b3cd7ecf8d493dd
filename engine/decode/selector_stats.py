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
(positions 0..accepted of each round), as engine/decode/confidence.py does. Drafts after the
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


def _row(r: Any, i: int) -> dict[str, Any]:
    """Verified draft i of a DFlash2 round."""
    drafted, accepted = field_of(r, "drafted")[i], field_of(r, "accepted", 0)
    ids, rank = field_of(r, "candidates")[i], field_of(r, "target_candidate_rank")[i]
    plain = field_of(r, "plain_top")[i]
    return {
        "position": i + 1,  # 1-based draft position in the block
        "drafted": drafted,
        "plain_top": plain,
        "rescored": plain != drafted,  # the selector's rescoring changed the head's pick
        "target_rank": rank,
        "target_choice": ids[rank] if 0 <= rank < len(ids) else None,
        "status": "accepted" if i < accepted else "rejected" if i == accepted else "after the break",
        "candidates": list(zip(ids, field_of(r, "candidate_scores")[i])),
        "drafted_rank": ids.index(drafted) if drafted in ids else -1,
    }


def positions(r: Any) -> list[dict[str, Any]]:
    """Per verified draft of a DFlash2 round: its candidates and what became of them ([] for v1)."""
    return [_row(r, i) for i in range(_verified(r))]


def _kind(target_rank: int, target_choice: Optional[int], drafted: int) -> str:
    """Whose miss a rejected draft was (see the module doc)."""
    if target_rank < 0:
        return "drafter"
    return "selector" if target_choice != drafted else "sampling"


def miss(r: Any) -> Optional[dict[str, Any]]:
    """The first rejected draft of a DFlash2 round and whose miss it was; None when none was rejected."""
    accepted = field_of(r, "accepted", 0)
    if accepted >= _verified(r):
        return None
    row = _row(r, accepted)
    return {**row, "kind": _kind(row["target_rank"], row["target_choice"], row["drafted"])}


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
    for r in rounds:  # one pass, fields read once a round: live runs recount thousands of rounds
        accepted, drafted, plain = field_of(r, "accepted", 0), field_of(r, "drafted"), field_of(r, "plain_top")
        candidates, ranks = field_of(r, "candidates"), field_of(r, "target_candidate_rank")
        for i in range(min(accepted + 1, _verified(r))):
            rank, ids = ranks[i], candidates[i]
            choice = ids[rank] if 0 <= rank < len(ids) else None
            out["judged"] += 1
            if 0 <= rank < k:
                out["rank_counts"][rank] += 1
            else:
                out["not_candidate"] += 1
            ok = i < accepted
            if plain[i] != drafted[i]:
                out["rescored"] += 1
                out["rescored_accepted"] += ok
                out["rescored_plain_was_target"] += choice == plain[i]
            else:
                out["kept"] += 1
                out["kept_accepted"] += ok
            if i == accepted:
                out["misses"][_kind(rank, choice, drafted[i])] += 1
    return out
