"""Why a round accepted what it did: per drafted position, how sure each model was.

For draft i (compared with the target's row i of the verify):
- draft_p: the drafter's probability of the token it drafted;
- target_p: the target's probability of that same token;
- margin: the target's top-1 minus top-2 logit (how clear its own choice was);
- target_rank: where the target's choice ranked in the drafter's distribution (0: the
  drafter's own first choice; large: the drafter never considered it).
Plain softmax of the raw logits (temperature 1), whatever the sampling settings, so runs compare.
"The drafter" is whoever proposed: the DFlash drafter, a draft model, or a copy of the context
(--lookup), which has no logits: it proposes each token with certainty (acceptance takes its q
one-hot on it), so its draft_p is 1 and the target's choice ranks 0 where it is the copied token,
1 (after it) where not.

Where MLX runs on the CPU the table is computed in numpy instead (`explain_on_host`): MLX's CPU
exp is slow here (about 1 ms for a 16 x 4096 block, numpy's 0.1 ms), which made this table a tenth
of a demo round. On a GPU the MLX graph is the cheap one and is evaluated with the round.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

FIELDS = ("draft_p", "target_p", "margin", "target_rank")


def explain(draft_logits: Optional[mx.array], target_logits: mx.array, drafts: mx.array) -> mx.array:
    """(4, n) float32, rows in FIELDS order, for the n verified drafts (lazy: evaluate with the round);
    `draft_logits` None for a copy's drafts."""
    n = drafts.shape[0]
    tl = target_logits[:n].astype(mx.float32)
    idx = drafts.reshape(n, 1)
    target_p = mx.take_along_axis(mx.softmax(tl, axis=-1), idx, axis=-1)[:, 0]
    top2 = mx.topk(tl, 2, axis=-1)
    margin = mx.max(top2, axis=-1) - mx.min(top2, axis=-1)
    choice = mx.argmax(tl, axis=-1).reshape(n, 1)
    if draft_logits is None:  # a copy: certain of each token
        draft_p = mx.ones((n,), dtype=mx.float32)
        rank = (choice[:, 0] != drafts).astype(mx.float32)
    else:
        dl = draft_logits[:n].astype(mx.float32)
        draft_p = mx.take_along_axis(mx.softmax(dl, axis=-1), idx, axis=-1)[:, 0]
        rank = mx.sum(dl > mx.take_along_axis(dl, choice, axis=-1), axis=-1).astype(mx.float32)
    return mx.stack([draft_p, target_p, margin, rank])


def explain_on_host(draft_logits: Optional[np.ndarray], target_logits: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """explain() in numpy, for float32 logits: (4, n) float32, rows in FIELDS order. At a real
    vocabulary (152k) its exps are most of its cost and memory traffic the rest, so it goes a row at
    a time (a 152k row fits in a core's cache: each is read from memory once) and makes no more
    passes over a row than it must: one exp each, the target's top two from its argmax (a
    partition cost as much as the rest). It never writes to its inputs (on the CPU they are
    read-only views of MLX's memory)."""
    n = drafts.shape[0]
    out = np.empty((4, n), np.float32)
    scratch = np.empty(target_logits.shape[-1], np.float32)
    for i, (target_row, draft) in enumerate(zip(target_logits[:n], drafts)):
        choice = int(target_row.argmax())
        top = target_row[choice]
        runner_up = max(target_row[:choice].max(initial=-np.inf), target_row[choice + 1:].max(initial=-np.inf))
        out[1, i] = np.exp(target_row[draft] - _logsumexp(target_row, top, scratch))
        out[2, i] = top - runner_up
        if draft_logits is None:  # a copy: certain of each token
            out[0, i], out[3, i] = 1.0, float(choice != draft)
        else:
            draft_row = draft_logits[i]
            out[0, i] = np.exp(draft_row[draft] - _logsumexp(draft_row, draft_row.max(), scratch))
            out[3, i] = np.count_nonzero(draft_row > draft_row[choice])
    return out


def _logsumexp(row: np.ndarray, top: np.float32, scratch: np.ndarray) -> np.float32:
    """A row's logsumexp, given its max (`scratch`: room for the row)."""
    shifted = np.subtract(row, top, out=scratch[: row.size])
    np.exp(shifted, out=shifted)
    return top + np.log(shifted.sum())


def as_lists(table: list[list[float]]) -> dict[str, list]:
    """The evaluated table as the round event's fields (rounded; ranks as ints)."""
    draft_p, target_p, margin, rank = table
    return {
        "draft_p": [round(v, 4) for v in draft_p],
        "target_p": [round(v, 4) for v in target_p],
        "margin": [round(v, 3) for v in margin],
        "target_rank": [int(v) for v in rank],
    }
