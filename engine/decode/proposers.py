"""Who proposes a round's drafts.

A proposer is what the round loop (engine/decode/speculative.py) asks for drafts: given the
anchor, how many positions the round verifies and the anchor's absolute position, it returns a
Proposal whose drafts are queued, not awaited (the loop builds the verify's graph while they
compute); after the verify, `observe` tells it what the target saw, so it can keep its own state
(the DFlash drafter keeps the target's taps of the committed positions as its context).

`source` names it in round events and traces.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from engine.decode.proposal import Proposal, propose
from engine.decode.sampling import Sampler
from engine.decode.settings import GenerationSettings
from engine.models.pair import LoadedPair

DRAFTER = "drafter"


class DrafterProposer:
    """The DFlash drafter: a block drafted in one pass over the target's taps of the context."""

    source = DRAFTER
    needs_taps = True  # the verify records the target's taps: they are the drafter's next context

    def __init__(self, pair: LoadedPair, settings: GenerationSettings, sampler: Sampler):
        self.drafter, self.head, self.sampler = pair.drafter, pair.head, sampler
        self.cache = pair.drafter.make_cache(settings.draft_window or None, settings.draft_sink)
        self.pending: list[mx.array] = []  # target taps the drafter has not seen yet

    def observe(self, taps: Optional[mx.array]) -> None:
        """The target's taps (1, n, k*H) of positions just committed (or of the prompt)."""
        if taps is not None:
            self.pending.append(taps)

    def propose(self, anchor: int, length: int, position: int) -> Proposal:
        """The block's drafts d1..d_{length-1} (queued, not awaited), (at T > 0) the log-probs they
        were drawn from, the drafter's logits and (DFlash2) its selector's walk."""
        if length <= 1:
            return Proposal(mx.array([], dtype=mx.int32), None, None)
        ids = mx.array([anchor] + [self.drafter.cfg.mask_token_id] * (length - 1))[None]
        pending = self.pending
        ctx = mx.concatenate(pending, axis=1) if len(pending) > 1 else (pending[0] if pending else None)
        hidden = self.drafter(self.drafter.embed(self.head, ids), ctx, self.cache, position)
        proposal = propose(self.drafter, self.head, hidden[0, 1:], anchor, self.sampler)
        mx.async_eval(proposal.drafts, proposal.logq, [c.state for c in self.cache])
        self.pending = []
        return proposal

    def context_width(self) -> int:
        """Context positions the drafter attended to in its last draft: its widest layer's cache."""
        return max((c.keys.shape[2] for c in self.cache if c.keys is not None), default=0)
