"""What the round loop (engine/decode/speculative.py) asks of whoever proposes a round's drafts.

Every proposer (engine/decode/proposers.py) subclasses `Proposer`: it must say how it proposes;
everything else has a default that does nothing, so the loop calls each method unconditionally.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import mlx.core as mx

from engine.decode.curve import CostCurve
from engine.decode.events import DRAFTER
from engine.decode.proposal import Proposal


def no_drafts(source: str) -> Proposal:
    return Proposal(mx.array([], dtype=mx.int32), None, None, source=source)


class Proposer(ABC):
    """A round's drafts, and what the proposer keeps of the run between rounds."""

    source: str = DRAFTER  # its name in round events and traces
    needs_taps: bool = False  # whether the verify records the target's taps (a drafter's context)

    @abstractmethod
    def propose(self, anchor: int, length: int, position: int, room: int) -> Proposal:
        """A Proposal whose drafts are queued, not awaited (the loop builds the verify's graph while
        they compute); `length` is the round's verify length, `room` the tokens the run still wants."""

    def prefill(self) -> None:
        """Run anything of its own over the prompt (a draft model's cache), during the run's prefill."""

    def observe(self, committed: list[int], taps: Optional[mx.array]) -> None:
        """What a round (or a plain step) committed and the target's taps of those positions, so it
        keeps its own state (the drafter's context, the lookup index, a draft model's cache)."""

    def record(self, proposal: Proposal, accepted: int) -> None:
        """How its proposal fared (after observe(); rounds only, not plain steps)."""

    def stepped(self, committed: list[int]) -> None:
        """Auto's plain step committed these (after observe()), for what it learns between rounds."""

    def copy_ready(self) -> bool:
        """Whether it would verify a copy now (DFlash rounds with lookup): auto's plain steps end there."""
        return False

    def price_copies(self, curve: CostCurve) -> None:
        """--block-size auto's cost curve, for a proposer whose copies are only as long as they pay."""

    def context_width(self) -> int:
        """Context positions its last draft attended to (the round event's draft_context)."""
        return 0
