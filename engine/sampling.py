"""Sampling settings and the distributions that AR and DFlash both draw from.

Filters (top-p, min-p, top-k) apply to log-probabilities at temperature 1, then
the temperature scales them, in the order mlx-lm's sampler uses. AR samples from
these; DFlash drafts from the drafter's and accepts against the target's, so both
modes draw from the same target distribution.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from engine.errors import SettingsError


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise SettingsError(f"temperature {self.temperature} is outside 0..100 (0 means greedy).")
        if not 0.0 < self.top_p <= 1.0:
            raise SettingsError(f"top-p {self.top_p} is outside (0, 1] (1 turns it off).")
        if not 0 <= self.top_k < vocab_size:
            raise SettingsError(f"top-k {self.top_k} is outside 0..{vocab_size - 1} (0 turns it off).")
        if not 0.0 <= self.min_p < 1.0:
            raise SettingsError(f"min-p {self.min_p} is outside [0, 1) (0 turns it off).")
        if not 0 <= self.seed < 2**63:
            raise SettingsError(f"seed {self.seed} must be a non-negative integer.")

    def to_dict(self) -> dict:
        return asdict(self)


def log_probs(logits: mx.array, s: SamplingSettings) -> mx.array:
    """Filtered, temperature-scaled log-probabilities (normalised) over the last axis."""
    x = logits.astype(mx.float32)
    x = x - mx.logsumexp(x, axis=-1, keepdims=True)
    if s.top_p < 1.0:
        x = apply_top_p(x, s.top_p)
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

    def _next_key(self) -> mx.array:
        self.key, sub = mx.random.split(self.key)
        return sub

    def sample(self, logits: mx.array) -> mx.array:
        """Token ids for each row of logits (..., V)."""
        if self.s.greedy:
            return mx.argmax(logits, axis=-1)
        return mx.random.categorical(log_probs(logits, self.s), key=self._next_key())

    def draft(self, logits: mx.array) -> tuple[mx.array, mx.array | None]:
        """Draft ids and (T > 0) the drafter's log-probs they were drawn from."""
        if self.s.greedy:
            return mx.argmax(logits, axis=-1), None
        lq = log_probs(logits, self.s)
        return mx.random.categorical(lq, key=self._next_key()), lq

    def verify(self, target_logits: mx.array, drafts: mx.array, draft_logq: mx.array | None) -> mx.array:
        """[accepted, next token] for one block, lazily.

        target_logits: (L, V) at [anchor, d1..d_{L-1}]; drafts: (L-1,).
        Greedy: accept while the draft equals the target's argmax; the next token is
        the target's argmax after the accepted prefix. T > 0: speculative sampling,
        accept d_i while u * q(d_i) < p(d_i); on the first rejection resample from
        norm(max(0, p - q)); if all pass, sample the bonus from p at the last row.
        """
        n = drafts.shape[0]
        if self.s.greedy:
            choice = mx.argmax(target_logits, axis=-1)
            ok = drafts == choice[:n]
            accepted = mx.sum(mx.cumprod(ok.astype(mx.int32)))
            return mx.stack([accepted, choice[accepted]])
        lp = log_probs(target_logits, self.s)
        if n == 0:
            return mx.stack([mx.array(0), mx.random.categorical(lp[0], key=self._next_key())])
        p, q = mx.exp(lp), mx.exp(draft_logq)
        idx = mx.arange(n)
        p_d, q_d = p[idx, drafts], q[idx, drafts]
        u = mx.random.uniform(shape=(n,), key=self._next_key())
        ok = u * q_d < p_d
        accepted = mx.sum(mx.cumprod(ok.astype(mx.int32)))
        residual = mx.maximum(p[:n] - q, 0.0)
        mass = residual.sum(axis=-1, keepdims=True)
        # Where p <= q everywhere (no rejection possible) fall back to p itself.
        residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p[:n])
        candidates = mx.concatenate([mx.log(residual), lp[n:]], axis=0)
        nxt = mx.random.categorical(candidates, key=self._next_key())
        return mx.stack([accepted, nxt[accepted]])
