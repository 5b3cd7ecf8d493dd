"""One generation run as the window sees it: events in, rounds/tokens/spans/plot series out.

Pure Python (no Qt, no MLX): the same record is filled from live worker events
and from a trace file, so live runs and replays render through one path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from engine.decode.events import Event, RoundEvent, StartEvent, SummaryEvent, TextEvent
from engine.decode.stats import RoundStats
from app.tokens import Span, SpanAligner, TokenTable

# Provenance of an output token.
PREFILL = "prefill"  # the first token, sampled from the prompt's prefill
ACCEPTED = "accepted"  # a draft the target accepted
BONUS = "bonus"  # the target's token after a fully accepted block
CORRECTION = "correction"  # the target's token replacing the first rejected draft
AR = "ar"  # plain autoregressive step
PLAIN = "plain"  # a DFlash run's plain step: auto skipped the drafter (engine.decode.events.PLAIN)


@dataclass
class OutToken:
    index: int  # position in the generated output
    id: int
    kind: str
    round: Optional[int]  # the DFlash round that committed it
    block_pos: Optional[int]  # position in that round's block (0 is the anchor)
    start: int = -1  # span in RunRecord.text, once aligned
    end: int = -1


class RunRecord:
    """Everything one run (AR or DFlash) produced, in forms the views read directly."""

    def __init__(self, start: StartEvent, header: Optional[dict[str, Any]] = None,
                 table: Optional[TokenTable] = None):
        self.start = start
        self.mode = start.mode
        self.header = header  # the trace header (dflash-trace/1)
        self.table = table
        self.events: list[Event] = [start]
        self.rounds: list[RoundEvent] = []
        self.tokens: list[OutToken] = []
        self.round_tokens: dict[int, list[int]] = {}
        self._chunks: list[str] = []  # streamed text, joined on demand (appending a str is quadratic)
        self._text: Optional[str] = ""
        self.spans: list[Span] = []
        self.summary: Optional[SummaryEvent] = None
        self.replayed = False  # read from a trace: no summary there means the run never finished
        self._aligner = SpanAligner(table)
        # Plot series, grown as events arrive.
        self.tps_t: list[float] = []
        self.tps_v: list[float] = []
        self.acc_len: list[int] = []  # accepted + 1 per round, for the plot
        self.stats = RoundStats()  # tau, per-position acceptance, round times (as the engine reports them)
        self.last_t = 0.0

    # ---- feeding -------------------------------------------------------------------------

    def add(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, RoundEvent):
            self._add_round(event)
        elif isinstance(event, TextEvent):
            self._add_text(event)
        elif isinstance(event, SummaryEvent):
            self.summary = event
            self.spans += self._aligner.feed("", [], final=True)

    def _add_round(self, r: RoundEvent) -> None:
        self.rounds.append(r)
        self.acc_len.append(r.accepted + 1)
        self.stats.add(r)

    def _add_text(self, ev: TextEvent) -> None:
        new = []
        rnd = self.rounds[ev.round] if ev.round is not None and ev.round < len(self.rounds) else None
        for k, tid in enumerate(ev.token_ids):
            index = len(self.tokens)
            if rnd is not None:
                kind = ACCEPTED if k < rnd.accepted else rnd.bonus_kind
                tok = OutToken(index, tid, kind, rnd.index, k + 1)
                self.round_tokens.setdefault(rnd.index, []).append(index)
            else:
                tok = OutToken(index, tid, PREFILL if index == 0 else AR, None, None)
            self.tokens.append(tok)
            new.append(tok)
        if ev.text:
            self._chunks.append(ev.text)
            self._text = None
        self.spans += self._aligner.feed(ev.text, new)
        if ev.token_ids and ev.t > 0:
            self.tps_t.append(ev.t)
            self.tps_v.append(len(self.tokens) / ev.t)
        self.last_t = max(self.last_t, ev.t)

    # ---- reading -------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The whole output text streamed so far."""
        if self._text is None:
            self._text = "".join(self._chunks)
            self._chunks = [self._text]
        return self._text

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def tok_per_s(self) -> Optional[float]:
        """The run's speed; None until it has decoded past its first token (that one is the prefill's,
        and a rate over it alone, thousands of tok/s after a Stop, means nothing), and None for a run
        read from a trace without its summary (cut short: a rate over its first rounds is no run's)."""
        if self.summary is not None:
            return self.summary.tok_per_s if self.summary.timed else None
        if self.replayed:
            return None
        return self.tps_v[-1] if self.tps_v else None

    @property
    def tau(self) -> Optional[float]:
        """Mean acceptance length (bonus counted) over rounds that drafted, as the engine reports it."""
        return self.stats.tau

    @property
    def per_position_acceptance(self) -> list[float]:
        return self.stats.per_position_acceptance

    def token_ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    def records(self) -> list[dict[str, Any]]:
        """Trace records after the header: rounds, text and the summary, as the engine writes them."""
        from engine.decode.events import to_dict

        return [to_dict(e) for e in self.events if not isinstance(e, StartEvent)]


def start_from_header(header: dict[str, Any]) -> StartEvent:
    """The StartEvent a trace header was written from."""
    return StartEvent(
        mode=header.get("mode") or "dflash",
        settings=header.get("settings") or {},
        model=header.get("model") or {"target": header.get("target"), "drafter": header.get("drafter")},
        prompt_ids=list(header.get("prompt_ids") or []),
    )


def record_from_trace(header: dict[str, Any], records: list[dict[str, Any]],
                      table: Optional[TokenTable]) -> RunRecord:
    """Replay a trace (read by engine.tools.trace.read_trace) into a record."""
    from engine.decode.events import EVENT_TYPES, from_dict

    run = RunRecord(start_from_header(header), header, table)
    for rec in records:
        if rec.get("type") in EVENT_TYPES and rec.get("type") != "start":
            run.add(from_dict(rec))
    return run
