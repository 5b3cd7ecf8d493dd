"""The distributions that AR and DFlash both draw from, and the sampler that draws.

Filters (top-p, min-p, top-k) apply to log-probabilities at temperature 1, then
the temperature scales them, in the order mlx-lm's sampler uses. AR samples from
these; DFlash drafts from the drafter's and accepts against the target's
(engine/decode/acceptance.py), so both modes draw from the same target distribution.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from engine.decode.settings import SamplingSettings


def log_probs(logits: mx.array, s: SamplingSettings) -> mx.array:
    """Filtered, temperature-scaled log-probabilities (normalised) over the last axis. Only top-p
    needs them normalised before the temperature (it exponentiates them); min-p and top-k compare
    within a row, so without top-p one normalisation does: a logsumexp is a pass of exps over the
    vocabulary per row, the dearest part of sampling at 152k tokens."""
    x = logits.astype(mx.float32)
    if s.top_p < 1.0:
        x = apply_top_p(x - mx.logsumexp(x, axis=-1, keepdims=True), s.top_p)
    if s.min_p > 0.0:
        x = apply_min_p(x, s.min_p)
    if s.top_k > 0:
        x = apply_top_k(x, s.top_k)
    x = x / s.temperature
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


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
        return mx.random.categorical(log_probs(logits, self.s), key=self.next_key())

    def draft(self, logits: mx.array) -> tuple[mx.array, mx.array | None]:
        """Draft ids and (T > 0) the drafter's log-probs they were drawn from."""
        if self.s.greedy:
            return mx.argmax(logits, axis=-1), None
        lq = log_probs(logits, self.s)
        return mx.random.categorical(lq, key=self.next_key()), lq
