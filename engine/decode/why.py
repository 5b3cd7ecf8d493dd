"""Why a round accepted what it did: per drafted position, how sure each model was.

For draft i (compared with the target's row i of the verify):
- draft_p: the drafter's probability of the token it drafted;
- target_p: the target's probability of that same token;
- margin: the target's top-1 minus top-2 logit (how clear its own choice was);
- target_rank: where the target's choice ranked in the drafter's distribution (0: the
  drafter's own first choice; large: the drafter never considered it).
Plain softmax of the raw logits (temperature 1), whatever the sampling settings, so runs compare.

Where MLX runs on the CPU the table is computed in numpy instead (`explain_on_host`): MLX's CPU
exp is slow here (about 1 ms for a 16 x 4096 block, numpy's 0.1 ms), which made this table a tenth
of a demo round. On a GPU the MLX graph is the cheap one and is evaluated with the round.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

FIELDS = ("draft_p", "target_p", "margin", "target_rank")


def explain(draft_logits: mx.array, target_logits: mx.array, drafts: mx.array) -> mx.array:
    """(4, n) float32, rows in FIELDS order, for the n verified drafts (lazy: evaluate with the round)."""
    n = drafts.shape[0]
    dl = draft_logits[:n].astype(mx.float32)
    tl = target_logits[:n].astype(mx.float32)
    idx = drafts.reshape(n, 1)
    draft_p = mx.take_along_axis(mx.softmax(dl, axis=-1), idx, axis=-1)[:, 0]
    target_p = mx.take_along_axis(mx.softmax(tl, axis=-1), idx, axis=-1)[:, 0]
    top2 = mx.topk(tl, 2, axis=-1)
    margin = mx.max(top2, axis=-1) - mx.min(top2, axis=-1)
    choice = mx.argmax(tl, axis=-1).reshape(n, 1)
    rank = mx.sum(dl > mx.take_along_axis(dl, choice, axis=-1), axis=-1).astype(mx.float32)
    return mx.stack([draft_p, target_p, margin, rank])


def explain_on_host(draft_logits: np.ndarray, target_logits: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """explain() in numpy, for float32 logits: (4, n) float32, rows in FIELDS order. At a real
    vocabulary (152k) its exps are most of its cost, so it makes no more passes over the rows than
    it must: one exp each, in place, and the target's top two from its argmax (a partition cost
    as much as the rest)."""
    n = drafts.shape[0]
    dl, tl = draft_logits[:n], target_logits[:n]
    rows = np.arange(n)
    choice = tl.argmax(axis=-1)
    top = tl[rows, choice]
    draft_p = np.exp(dl[rows, drafts] - _logsumexp(dl, dl.max(axis=-1)))
    target_p = np.exp(tl[rows, drafts] - _logsumexp(tl, top))
    margin = top - _runner_up(tl, rows, choice)
    rank = (dl > dl[rows, choice][:, None]).sum(axis=-1)
    return np.stack([draft_p, target_p, margin, rank]).astype(np.float32)


def _logsumexp(x: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Each row's logsumexp, given its max."""
    shifted = np.subtract(x, top[:, None])
    np.exp(shifted, out=shifted)
    return top + np.log(shifted.sum(axis=-1))


def _runner_up(x: np.ndarray, rows: np.ndarray, choice: np.ndarray) -> np.ndarray:
    """Each row's second-largest value (its largest again on a tie), the row's argmax hidden for one
    max() and put back."""
    kept = x[rows, choice].copy()
    x[rows, choice] = -np.inf
    try:
        return x.max(axis=-1)
    finally:
        x[rows, choice] = kept


def as_lists(table: list[list[float]]) -> dict[str, list]:
    """The evaluated table as the round event's fields (rounded; ranks as ints)."""
    draft_p, target_p, margin, rank = table
    return {
        "draft_p": [round(v, 4) for v in draft_p],
        "target_p": [round(v, 4) for v in target_p],
        "margin": [round(v, 3) for v in margin],
        "target_rank": [int(v) for v in rank],
    }
