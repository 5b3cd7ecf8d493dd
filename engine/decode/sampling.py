"""The distributions that AR and DFlash both draw from, and the sampler that draws.

Filters (top-p, min-p, top-k) apply to log-probabilities at temperature 1, then
the temperature scales them, in the order mlx-lm's sampler uses. AR samples from
these; DFlash drafts from the drafter's and accepts against the target's
(engine/decode/acceptance.py), so both modes draw from the same target distribution.

With top-k set (Qwen's recommended sampling sets 20) every filter keeps a prefix of the row's
tokens ranked by logit, so only the k best need ranking: the filters are applied to those
(`top_k_log_probs`) instead of sorting and partitioning the whole vocabulary per row.
"""

from __future__ import annotations

import math

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_p

from engine.decode.settings import SamplingSettings
from engine.decode.top_k import over_vocabulary, top_k_indices


def log_probs(logits: mx.array, s: SamplingSettings) -> mx.array:
    """Filtered, temperature-scaled log-probabilities (normalised) over the last axis. Only top-p
    needs them normalised before the temperature (it exponentiates them); min-p and top-k compare
    within a row, so without top-p one normalisation does: a logsumexp is a pass of exps over the
    vocabulary per row, the dearest part of sampling at 152k tokens."""
    if s.top_k > 0:
        return over_vocabulary(logits.shape, *top_k_log_probs(logits, s))
    x = logits.astype(mx.float32)
    if s.top_p < 1.0:
        x = apply_top_p(x - mx.logsumexp(x, axis=-1, keepdims=True), s.top_p)
    if s.min_p > 0.0:
        x = apply_min_p(x, s.min_p)
    x = x / s.temperature
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def top_k_log_probs(logits: mx.array, s: SamplingSettings) -> tuple[mx.array, mx.array]:
    """With top-k on: (ids, log-probs) of the row's k best tokens, those the other filters drop at
    -inf; the distribution log_probs() gives, with every token outside the k at probability 0.
    Top-p keeps the best tokens while the mass ranked above each is under top_p of the whole
    row's, and ties with the last one kept (as mlx-lm's apply_top_p); min-p those within log(min_p)
    of the best."""
    x = logits.astype(mx.float32)
    idx = top_k_indices(x, s.top_k)
    vals = mx.take_along_axis(x, idx, axis=-1)
    keep = mx.ones(vals.shape, dtype=mx.bool_)
    if s.top_p < 1.0:
        lp = vals - mx.logsumexp(x, axis=-1, keepdims=True)
        ranked = -mx.sort(-lp, axis=-1)
        p = mx.exp(ranked)
        above = mx.cumsum(p, axis=-1) - p  # the mass ranked above each
        last = mx.sum(above < s.top_p, axis=-1, keepdims=True) - 1
        keep = lp >= mx.take_along_axis(ranked, mx.maximum(last, 0), axis=-1)
    if s.min_p > 0.0:
        keep = keep & (vals >= mx.max(vals, axis=-1, keepdims=True) + math.log(s.min_p))
    z = mx.where(keep, vals / s.temperature, -mx.inf)
    return idx, z - mx.logsumexp(z, axis=-1, keepdims=True)


class Sampler:
    """Draws tokens for one generation; owns its random key so runs repeat with a seed."""

    def __init__(self, settings: SamplingSettings):
        self.s = settings
        self.key = mx.random.key(settings.seed)

    def next_key(self) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        return sub

    def sample(self, logits: mx.array) -> mx.array:
        """Token ids for each row of logits (..., V)."""
        if self.s.greedy:
            return mx.argmax(logits, axis=-1)
        if self.s.top_k > 0:
            return self._draw_among_top_k(logits)[0]
        return mx.random.categorical(log_probs(logits, self.s), key=self.next_key())

    def draft(self, logits: mx.array) -> tuple[mx.array, mx.array | None]:
        """Draft ids and (T > 0) the drafter's log-probs they were drawn from."""
        if self.s.greedy:
            return mx.argmax(logits, axis=-1), None
        if self.s.top_k > 0:
            ids, idx, z = self._draw_among_top_k(logits)
            return ids, over_vocabulary(logits.shape, idx, z)
        lq = log_probs(logits, self.s)
        return mx.random.categorical(lq, key=self.next_key()), lq

    def _draw_among_top_k(self, logits: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """(ids drawn, the k ids of each row, their log-probs): a draw among the k, not over the
        whole vocabulary."""
        idx, z = top_k_log_probs(logits, self.s)
        pick = mx.random.categorical(z, key=self.next_key())
        return mx.take_along_axis(idx, pick[..., None], axis=-1)[..., 0], idx, z
