"""The round loop's observer: it times a round's stages and turns what the round did into its
RoundEvent, with the diagnostic tables (why a draft was accepted or not, and for DFlash2 the
selector's candidates), so the loop itself reads propose, verify, accept, roll back, commit.

Stages, in the order the loop marks them:
  start -> queued     the proposal is queued (its drafts compute while the verify graph is built)
  queued -> built     the verify's graph is built (Python work: verify time)
  built -> drafted    waiting for the drafts (draft time)
  drafted -> verified the verify, acceptance and the tables evaluated (verify time)
  verified -> rolled  the target's rollback (rollback time); the round's end (`t`)

The tables: on a GPU their MLX graphs are queued with the verify and evaluated with it (`queue`);
on the CPU they are computed on the host from the evaluated logits (engine/decode/why.py says
why), as part of the verify's time.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import mlx.core as mx
import numpy as np

from engine.decode.events import RoundEvent
from engine.decode.proposal import Proposal, selector_fields, selector_table, selector_table_on_host
from engine.decode.why import as_lists, explain, explain_on_host


def _float32(a: mx.array) -> np.ndarray:
    return np.array(a if a.dtype == mx.float32 else a.astype(mx.float32))


class RoundRecorder:
    def __init__(self, on_host: bool):
        self.on_host = on_host  # tables in numpy (MLX runs on the CPU)
        self.marks: dict[str, float] = {}

    def mark(self, stage: str) -> None:
        self.marks[stage] = time.perf_counter()

    def ms(self, a: str, b: str) -> float:
        return round((self.marks[b] - self.marks[a]) * 1000.0, 4)

    def queue_tables(self, proposal: Proposal, logits: mx.array) -> list[mx.array]:
        """The tables' MLX graphs, to evaluate with the verify (none on the host, none without drafts
        or drafter logits)."""
        n = proposal.drafts.size
        if self.on_host or not n or proposal.logits is None:
            return []
        queued = [explain(proposal.logits, logits, proposal.drafts)]
        if proposal.selection is not None:
            queued += selector_table(proposal.selection, logits, n)
        return queued

    def table_fields(self, proposal: Proposal, logits: mx.array, queued: list[mx.array]) -> dict[str, Any]:
        """The round event's table fields, from the evaluated `queued` graphs or (on the host) computed
        here from the evaluated logits."""
        n = proposal.drafts.size
        if not n or proposal.logits is None:
            return {}
        if self.on_host:
            target = _float32(logits)
            why = explain_on_host(_float32(proposal.logits), target, np.array(proposal.drafts))
            selection = proposal.selection
            selector = selector_table_on_host(selection, target, n) if selection is not None else None
        else:
            why, selector = queued[0], (queued[1:] or None)
        fields = as_lists(why.tolist())
        if selector is not None:
            fields.update(selector_fields([a.tolist() for a in selector]))
        return fields

    def event(self, *, t_first: float, tables: Optional[dict[str, Any]] = None, **fields) -> RoundEvent:
        """The round's event: its fields, its stage times and the tables."""
        return RoundEvent(
            draft_ms=self.ms("start", "queued") + self.ms("built", "drafted"),
            verify_ms=self.ms("queued", "built") + self.ms("drafted", "verified"),
            rollback_ms=self.ms("verified", "rolled"),
            t=self.marks["rolled"] - t_first,
            **fields,
            **(tables or {}),
        )
