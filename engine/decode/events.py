"""Typed generation events. Plain Python data only: they cross threads and go into traces."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Union


@dataclass
class StartEvent:
    mode: str  # "dflash" or "ar"
    settings: dict[str, Any]
    model: dict[str, Any]
    prompt_ids: list[int]
    type: str = "start"


@dataclass
class RoundEvent:
    index: int
    position: int  # absolute position of the anchor
    anchor: int
    drafted: list[int]  # the L-1 draft ids, without the anchor
    accepted: int
    bonus: int  # the target's token after the accepted prefix
    bonus_kind: str  # "bonus" when every draft was accepted, else "correction"
    committed: list[int]  # tokens this round added to the output, after any cut
    draft_ms: float
    verify_ms: float
    rollback_ms: float
    t: float  # seconds since decoding started, at the end of the round
    generated: int  # output length after this round
    type: str = "round"


@dataclass
class TextEvent:
    text: str
    token_ids: list[int]
    round: int | None  # the DFlash round that committed these tokens; None in AR mode
    t: float
    type: str = "text"


@dataclass
class SummaryEvent:
    mode: str
    token_ids: list[int]
    text: str
    num_generated: int
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    tok_per_s: float
    num_rounds: int
    mean_acceptance_length: float | None
    acceptance_histogram: list[int]
    per_position_acceptance: list[float]
    mean_draft_ms: float | None
    mean_verify_ms: float | None
    mean_rollback_ms: float | None
    stop_reason: str  # "eos", "max_tokens", "stop_string" or "cancelled"
    peak_memory_mb: float
    type: str = "summary"


Event = Union[StartEvent, RoundEvent, TextEvent, SummaryEvent]
EVENT_TYPES = {cls.__dataclass_fields__["type"].default: cls for cls in (StartEvent, RoundEvent, TextEvent, SummaryEvent)}


def to_dict(event: Event) -> dict[str, Any]:
    return asdict(event)


def from_dict(data: dict[str, Any]) -> Event:
    cls = EVENT_TYPES[data["type"]]
    return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
