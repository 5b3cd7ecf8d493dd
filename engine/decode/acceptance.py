"""Where acceptance is decided: how many drafts of a block the target keeps, and its next token.

Greedy: accept while each draft equals the target's argmax at the previous position;
the next token is the target's argmax after the accepted prefix. At T > 0, speculative
sampling: accept d_i while u * q(d_i) < p(d_i); at the first rejection resample from
norm(max(0, p - q)); when every draft passes, sample the bonus from p at the last row.
Both keep DFlash's output distributed exactly as plain decoding's.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from engine.decode.sampling import Sampler, log_probs


def greedy_acceptance(target_logits: mx.array, drafts: mx.array) -> mx.array:
    """[accepted, next token]: target_logits (L, V) at [anchor, d1..d_{L-1}], drafts (L-1,)."""
    choice = mx.argmax(target_logits, axis=-1)
    ok = drafts == choice[: drafts.shape[0]]
    accepted = mx.sum(mx.cumprod(ok.astype(mx.int32)))
    return mx.stack([accepted, choice[accepted]])


def speculative_acceptance(sampler: Sampler, target_logits: mx.array, drafts: mx.array,
                           draft_logq: Optional[mx.array]) -> mx.array:
    """[accepted, next token] by speculative sampling against the drafter's log-probs draft_logq.

    The accept tests need p and q only at the drafts; the next token is drawn from one row: the
    residual at the first rejection, or p after the last draft. So one row, not the block, pays for
    the residual and the draw (at a 152k vocabulary each full-block pass over p and q cost about
    as much as the verify's own head on the CPU)."""
    n = drafts.shape[0]
    lp = log_probs(target_logits, sampler.s)
    if n == 0:
        return mx.stack([mx.array(0), mx.random.categorical(lp[0], key=sampler.next_key())])
    idx = mx.arange(n)
    p_d, q_d = mx.exp(lp[idx, drafts]), mx.exp(draft_logq[idx, drafts])
    u = mx.random.uniform(shape=(n,), key=sampler.next_key())
    ok = u * q_d < p_d
    accepted = mx.sum(mx.cumprod(ok.astype(mx.int32)))
    lp_row = mx.take(lp, accepted, axis=0)  # the row the next token comes from
    p_row = mx.exp(lp_row)
    residual = mx.maximum(p_row - mx.exp(mx.take(draft_logq, mx.minimum(accepted, n - 1), axis=0)), 0.0)
    mass = residual.sum()
    # every draft accepted: p itself; a rejection where p <= q everywhere (it cannot happen) too
    resample = (accepted < n) & (mass > 0)
    row = mx.where(resample, mx.log(residual / mx.maximum(mass, 1e-30)), lp_row)
    nxt = mx.random.categorical(row, key=sampler.next_key())
    return mx.stack([accepted, nxt])


def accept(sampler: Sampler, target_logits: mx.array, drafts: mx.array, draft_logq: Optional[mx.array]) -> mx.array:
    """[accepted, next token] for one verified block, lazily (nothing is evaluated here)."""
    if sampler.s.greedy:
        return greedy_acceptance(target_logits, drafts)
    return speculative_acceptance(sampler, target_logits, drafts, draft_logq)
