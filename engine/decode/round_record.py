"""The round loop's observer: it times a round's stages and turns what the round did into its
RoundEvent, with the diagnostic tables (why a draft was accepted or not, and for DFlash2 the
selector's candidates), so the loop itself reads propose, verify, accept, roll back, commit.

Stages, in the order the loop marks them:
  start -> queued     the proposal is queued (its drafts compute while the verify graph is built)
  queued -> built     the verify's graph is built (Python work: verify time)
  built -> drafted    waiting for the drafts (draft time)
  drafted -> verified the verify, acceptance and the tables evaluated (verify time)
  verified -> rolled  the target's rollback (rollback time); the round's end (`t`)

The tables: on a GPU their MLX graphs are queued with the verify and evaluated with it (`queue`).
On the CPU they are computed on the host from the evaluated logits (engine/decode/why.py says why),
on a thread of their own while the next round runs: at a real vocabulary (152k rows) they cost
about 10 ms a round, a sixth of a round of the demo pair padded to it, when done in line. Only
numpy views, made here on the decode thread, cross to that thread: read-only, and each holds the
evaluated MLX array it reads, which nothing writes to once evaluated. A round whose tables are
computing is held, with its text, and given out (`emit`) once they are done: one round late,
in order; `release` gives out the last one when the loop ends.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Iterator, Optional

import mlx.core as mx
import numpy as np

from engine.decode.events import Event, RoundEvent
from engine.decode.drafts import Proposal, selector_fields, selector_table, selector_table_on_host
from engine.decode.why import as_lists, explain, explain_on_host


def _host_view(a: mx.array) -> np.ndarray:
    """A read-only float32 numpy view of an evaluated array's memory. No copy: copying a real
    vocabulary's logits (two 16 x 152k blocks) each round cost more than the tables themselves. The
    view holds the array (the buffer protocol's reference), so its memory lives while it is read."""
    a32 = a if a.dtype == mx.float32 else a.astype(mx.float32)
    mx.eval(a32)
    view = np.asarray(a32)
    view.flags.writeable = False
    return view


# Process-wide: a run's last tables may still compute as the next run starts, and a thread per run
# would be made and joined at every run (the window's race runs many).
_host_thread: Optional[ThreadPoolExecutor] = None


def _host_tables() -> ThreadPoolExecutor:
    """One thread for every run's host tables (runs are one at a time; a round's tables are queued
    behind the last round's)."""
    global _host_thread
    if _host_thread is None:
        _host_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dflash-round-tables")
    return _host_thread


def _tables_on_host(draft_logits: Optional[np.ndarray], target_logits: np.ndarray, drafts: np.ndarray,
                    selection: Optional[tuple[np.ndarray, ...]]) -> dict[str, Any]:
    """The round event's table fields from numpy views (runs on the host-tables thread); `draft_logits`
    None for a copy's drafts; `selection`: a DFlash2 selection's scores, candidates and plain_top."""
    n = drafts.size
    fields = as_lists(explain_on_host(draft_logits, target_logits, drafts).tolist())
    if selection is not None:
        table = selector_table_on_host(*selection, target_logits, n)
        fields.update(selector_fields([a.tolist() for a in table]))
    return fields


class RoundRecorder:
    def __init__(self, on_host: bool):
        self.on_host = on_host  # tables in numpy (MLX runs on the CPU), on the host-tables thread
        self.marks: dict[str, float] = {}
        # the host tables of the round being recorded, and the views they read: kept here so the MLX
        # arrays behind them are freed on the decode thread, after the tables are read, not on theirs
        self.computing: Optional[tuple[Future, tuple]] = None
        self.held: Optional[tuple[RoundEvent, Event, tuple[Future, tuple]]] = None  # a round, its text, its tables

    def mark(self, stage: str) -> None:
        self.marks[stage] = time.perf_counter()

    def ms(self, a: str, b: str) -> float:
        return round((self.marks[b] - self.marks[a]) * 1000.0, 4)

    def queue_tables(self, proposal: Proposal, logits: mx.array) -> list[mx.array]:
        """The tables' MLX graphs, to evaluate with the verify (none on the host, none without drafts)."""
        n = proposal.drafts.size
        if self.on_host or not n:
            return []
        queued = [explain(proposal.logits, logits, proposal.drafts)]
        if proposal.selection is not None:
            queued += selector_table(proposal.selection, logits, n)
        return queued

    def table_fields(self, proposal: Proposal, logits: mx.array, queued: list[mx.array]) -> dict[str, Any]:
        """The round event's table fields from the evaluated `queued` graphs; on the host, none yet:
        their computation starts on the host-tables thread from views of the evaluated logits, and
        `emit` gives the round out with them. A copy's drafts (no drafter logits) get the target's side."""
        n = proposal.drafts.size
        if not n:
            return {}
        if self.on_host:
            s = proposal.selection
            selection = None if s is None else (np.array(s.scores), np.array(s.candidates), np.array(s.plain_top))
            views = (None if proposal.logits is None else _host_view(proposal.logits), _host_view(logits))
            future = _host_tables().submit(_tables_on_host, *views, np.array(proposal.drafts), selection)
            self.computing = (future, views)
            return {}
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

    def emit(self, event: RoundEvent, text: Event) -> Iterator[Event]:
        """The events to give out now, in order: the round held before this one (with its tables),
        then this round and its text, unless its tables are computing on the host: then it is held
        until the next round's events or `release`."""
        yield from self.release()
        if self.computing is not None:
            self.held, self.computing = (event, text, self.computing), None
            return
        yield event
        yield text

    def release(self) -> Iterator[Event]:
        """The held round, its tables filled in, and its text (nothing when none is held)."""
        if self.held is None:
            return
        (event, text, (tables, views)), self.held = self.held, None
        fields = tables.result()
        del views  # the arrays they hold are freed here, on the decode thread (their last reference)
        yield replace(event, **fields)
        yield text
