"""Where a draft tree paid: per tree round and over a run (plain Python over round events or trace records).

A tree round (--tree; engine/decode/tree/) carries per node its parent, token, the drafter's summed
log-prob from the root (score) and its rank among the drafter's candidates at its depth (-1: a lookup
copy's), and the accepted path of nodes from the root. From these:

- `tree_nodes(r)`: one row per node, for drawing the tree: its depth, the drafter's probability of
  it given its parent (exp of its score less its parent's; a copy's is None), whether the target
  accepted it, and whether it was a second choice that was taken (rank > 0 on the path). At T > 0
  the scores are the drafter's ranked probabilities (the tree's shape) and a node's token is the
  draw of its rank, so the probability is its rank's, not necessarily its token's;
- `chain_depth(r)`: how many drafts the chain would have had accepted on the same round. The chain
  is the drafter's first choice at every depth: the tree's rank-0 line from the root. The target's
  choice along the accepted path is known, so the chain keeps step with the path while the path
  stays on rank 0, and breaks where the path takes another child (the target chose that child's
  token over the rank-0 sibling's). Where the path ends on the rank-0 line, or leaves it where the
  tree holds no rank-0 sibling, the chain might have gone on past what the tree drew: then the
  count is a lower bound (`exact` False). At T > 0 the walk tries the rank-0 child first with the
  chain's own test, so the count is the chain's in distribution, not for this round's draw;
- `tree_stats(rounds)`: over a run, accepted depth with the tree against the chain's, and
  acceptance by sibling rank (of the candidates the target judged, those whose parent it reached,
  how many it took).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from engine.decode.events import field_of

COPY = -1  # a node's rank when it came from a lookup copy (engine/decode/tree/layout.py COPY_RANK)


def is_tree_round(r: Any) -> bool:
    """Whether round r verified a draft tree (a chain's round carries no tree fields)."""
    return bool(field_of(r, "tree_parents"))


def _children(parents: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        if node:
            out.setdefault(parent, []).append(node)
    return out


def tree_nodes(r: Any) -> list[dict[str, Any]]:
    """Per node of a tree round (node 0 the anchor): what drawing the tree needs ([] for a chain's round)."""
    parents, tokens = field_of(r, "tree_parents") or [], field_of(r, "tree_tokens") or []
    scores, ranks = field_of(r, "tree_scores") or [], field_of(r, "tree_ranks") or []
    path = set(field_of(r, "tree_path") or [0])
    depths = [0] * len(parents)
    rows = []
    for node, parent in enumerate(parents):
        if node:
            depths[node] = depths[parent] + 1
        copy = node > 0 and ranks[node] == COPY
        rows.append({
            "node": node, "parent": parent, "depth": depths[node], "token": tokens[node], "rank": ranks[node],
            "p": None if node == 0 or copy else math.exp(min(scores[node] - scores[parent], 0.0)),
            "path_p": math.exp(min(scores[node], 0.0)),  # the drafter's probability of the whole prefix
            "accepted": node in path, "second_choice": node in path and node > 0 and ranks[node] > 0,
            "copy": copy,
        })
    return rows


def chain_depth(r: Any) -> tuple[int, bool]:
    """(drafts the chain would have had accepted on tree round r, whether that count is exact); see
    the module doc."""
    parents, ranks = field_of(r, "tree_parents") or [], field_of(r, "tree_ranks") or []
    path = field_of(r, "tree_path") or [0]
    children = _children(parents)
    for depth, node in enumerate(path[1:]):
        if ranks[node] != 0:  # the path left the chain here: it broke unless it had no rank-0 sibling to try
            return depth, any(ranks[c] == 0 for c in children.get(path[depth], []))
    end = path[-1]  # the target took no child of the path's end: a rank-0 child there was refused too
    return len(path) - 1, any(ranks[c] == 0 for c in children.get(end, []))


def rank_counts(r: Any) -> dict[int, tuple[int, int]]:
    """rank -> (accepted, judged) on tree round r: judged are the children of the nodes the target
    reached (the accepted path), accepted those it took."""
    parents, ranks = field_of(r, "tree_parents") or [], field_of(r, "tree_ranks") or []
    path = field_of(r, "tree_path") or [0]
    children, taken = _children(parents), set(path[1:])
    out: dict[int, tuple[int, int]] = {}
    for node in path:
        for child in children.get(node, []):
            acc, judged = out.get(ranks[child], (0, 0))
            out[ranks[child]] = (acc + (child in taken), judged + 1)
    return out


def tree_stats(rounds: Iterable[Any]) -> Optional[dict[str, Any]]:
    """Over a run's tree rounds: per round (index, tree's accepted drafts, the chain's, exact); their
    means and how many rounds the tree beat, matched or (only where the chain's count is a bound)
    may have lost to the chain; acceptance by sibling rank. None when no round verified a tree."""
    per_round, by_rank = [], {}
    for r in rounds:
        if not is_tree_round(r):
            continue
        chain, exact = chain_depth(r)
        per_round.append((field_of(r, "index"), len(field_of(r, "tree_path")) - 1, chain, exact))
        for rank, (acc, judged) in rank_counts(r).items():
            a, j = by_rank.get(rank, (0, 0))
            by_rank[rank] = (a + acc, j + judged)
    if not per_round:
        return None
    n = len(per_round)
    return {
        "rounds": per_round,
        "tree_rounds": n,
        "mean_tree": sum(t for _, t, _, _ in per_round) / n,
        "mean_chain": sum(c for _, _, c, _ in per_round) / n,
        "deeper": sum(t > c for _, t, c, _ in per_round),  # rounds a second choice (or a copy) carried further
        "bounded": sum(not e for _, _, _, e in per_round),  # rounds whose chain count is a lower bound
        "by_rank": dict(sorted(by_rank.items())),  # rank -> (accepted, judged); -1: lookup copies
    }
