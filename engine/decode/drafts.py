"""What the drafter proposes for a block: v1 drafts from its logits; DFlash2 walks its candidate
selector (engine/models/drafter2.py). Either way acceptance sees drafts and, at T > 0, the
log-probabilities they were drawn from, so the lossless rules of acceptance.py hold unchanged:
for DFlash2 q is the selector's softmax over the K candidates, zero elsewhere, and the residual
p - q at a rejection is taken over the whole vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import mlx.core as mx
import numpy as np

from engine.decode.sampling import Sampler


@dataclass
class Proposal:
    drafts: mx.array  # (T,)
    logq: Optional[mx.array]  # (T, V) at T > 0
    logits: Optional[mx.array]  # (T, V): the drafter's logits (DFlash2: before the selector's rescoring)
    selection: Any = None  # engine.models.drafter2.Selection for DFlash2
    source: str = "drafter"  # who proposed the drafts (engine/decode/proposers.py)
    choice: Optional[str] = None  # why these drafts and not a copy (or the block) in reach: --lookup's rounds
    # --tree: the draft tree the round verifies instead of `drafts` (engine/decode/tree/); `drafts` then
    # holds the drafter's whole block (the tree's candidates came from it)
    tree: Any = None
    path: Optional[list[int]] = None  # the tree's accepted nodes, set by the round loop once verified
    ms: Optional[float] = None  # the round's measured time to its commit, set by the round loop (--tree auto)


def propose(drafter, head, hidden: mx.array, anchor: int, sampler: Sampler) -> Proposal:
    """Drafts for block positions 1..T from the drafter's final hidden states `hidden` (T, H)."""
    logits = drafter.logits(head, hidden)
    if drafter.cfg.selector is None:
        drafts, logq = sampler.draft(logits)
        return Proposal(drafts, logq, logits)
    from engine.models.drafter2 import select

    s = sampler.s
    selection = select(drafter.candidate_selector, hidden, logits, anchor, drafter.cfg.selector.selector_top_k,
                       0.0 if s.greedy else s.temperature, None if s.greedy else sampler.next_key())
    return Proposal(selection.drafts, selection.logq, logits, selection)


SELECTOR_FIELDS = ("candidates", "candidate_scores", "target_candidate_rank", "plain_top")


def selector_table(selection, target_logits: mx.array, n: int) -> list[mx.array]:
    """For the n verified drafts (lazy): the candidates and their scores, best score first; where the
    target's own choice ranks among them (-1: not a candidate); the head's plain argmax."""
    order = mx.argsort(-selection.scores[:n], axis=-1)
    candidates = mx.take_along_axis(selection.candidates[:n], order, axis=-1)
    scores = mx.take_along_axis(selection.scores[:n], order, axis=-1)
    choice = mx.argmax(target_logits[:n], axis=-1)[:, None]
    hit = candidates == choice
    rank = mx.where(mx.any(hit, axis=-1), mx.argmax(hit.astype(mx.int32), axis=-1).astype(mx.int32), -1)
    return [candidates, scores, rank, selection.plain_top[:n]]


def selector_table_on_host(scores: np.ndarray, candidates: np.ndarray, plain_top: np.ndarray,
                           target_logits: np.ndarray, n: int) -> list[np.ndarray]:
    """selector_table() in numpy, for a selection's evaluated arrays (whole: slicing them in MLX first
    costs more) and the target's logits (MLX on the CPU: see engine/decode/why.py)."""
    scores = scores[:n]
    order = np.argsort(-scores, axis=-1, kind="stable")
    candidates = np.take_along_axis(candidates[:n], order, axis=-1)
    hit = candidates == target_logits[:n].argmax(axis=-1)[:, None]
    rank = np.where(hit.any(axis=-1), hit.argmax(axis=-1), -1)
    return [candidates, np.take_along_axis(scores, order, axis=-1), rank, plain_top[:n]]


def selector_fields(table: list[Any]) -> dict[str, list]:
    """The evaluated table (lists) as the round event's fields."""
    candidates, scores, rank, plain = table
    return {
        "candidates": candidates,
        "candidate_scores": [[round(v, 3) for v in row] for row in scores],
        "target_candidate_rank": [int(v) for v in rank],
        "plain_top": [int(v) for v in plain],
    }
