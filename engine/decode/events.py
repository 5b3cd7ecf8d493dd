"""Typed generation events. Plain Python data only: they cross threads and go into traces."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field
from typing import Any, Optional, Union

from engine.json_text import is_int, is_number


@dataclass
class StartEvent:
    mode: str  # "dflash" or "ar"
    settings: dict[str, Any]
    model: dict[str, Any]
    prompt_ids: list[int]
    type: str = "start"


PLAIN = "plain"  # a round event's bonus_kind when auto skipped the drafter: one token, no verify of drafts
# A round event's source: who proposed its drafts (engine/decode/proposers.py)
DRAFTER, LOOKUP, DRAFT_MODEL = "drafter", "lookup", "draft-model"


@dataclass
class CalibrationEvent:
    """Progress of --block-size auto's first measurement of this machine's cost curve (not written
    to traces; a cached curve sends none)."""
    done: int
    total: int
    type: str = "calibration"


@dataclass
class PrefillEvent:
    """Progress through the prompt: after each chunk (not written to traces)."""
    done: int  # prompt tokens in the target's caches now, reused ones included
    total: int  # prompt tokens
    reused: int  # prompt tokens taken from the previous run's caches
    type: str = "prefill"


@dataclass
class RoundEvent:
    index: int
    position: int  # absolute position of the anchor: the context depth the round ran at
    anchor: int
    drafted: list[int]  # the L-1 draft ids, without the anchor
    accepted: int
    bonus: int  # the target's token after the accepted prefix
    bonus_kind: str  # "bonus" when every draft was accepted, else "correction"; PLAIN for auto's plain steps
    committed: list[int]  # tokens this round added to the output, after any cut
    draft_ms: float
    verify_ms: float
    rollback_ms: float
    t: float  # seconds since decoding started, at the end of the round
    generated: int  # output length after this round
    verified: Optional[int] = None  # tokens the target verified: anchor + drafted (--block-size auto picks it)
    # context positions the drafter attended to this round (its widest layer): the whole context
    # (position) unless a draft window and sink keep less; None when nothing was drafted
    draft_context: Optional[int] = None
    source: Optional[str] = None  # who proposed the drafts ("drafter", ...); None when nothing was drafted
    # with --lookup, where a copy was in reach: why the round verified the copy or the drafter's block
    choice: Optional[str] = None
    unverified: list[int] = field(default_factory=list)  # drafts past the verified ones (older auto traces)
    # per verified draft (engine/decode/why.py): the drafter's and the target's probability of it, the
    # target's top-1 margin, and the rank of the target's choice in the drafter's distribution
    draft_p: list[float] = field(default_factory=list)
    target_p: list[float] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)
    target_rank: list[int] = field(default_factory=list)
    # DFlash2, per verified draft (engine/decode/drafts.py): the selector's K candidates and their
    # scores, best first; the rank of the target's choice among them (-1: not a candidate); the
    # head's plain argmax (where it differs from the draft, the selector's rescoring changed it)
    candidates: list[list[int]] = field(default_factory=list)
    candidate_scores: list[list[float]] = field(default_factory=list)
    target_candidate_rank: list[int] = field(default_factory=list)
    plain_top: list[int] = field(default_factory=list)
    # A draft tree's round (--tree; engine/decode/tree/): every node of the tree verified, node 0 the
    # anchor. Per node its parent (-1 at the root), token, the drafter's summed log-prob from the root
    # and its rank among the drafter's candidates at its depth (-1: a lookup copy's); `tree_path` the
    # accepted nodes from the root. `drafted` then holds the tokens along the accepted path and on
    # along first children to a leaf, so `accepted` counts the path's drafts. Empty for a chain's round.
    tree_parents: list[int] = field(default_factory=list)
    tree_tokens: list[int] = field(default_factory=list)
    tree_scores: list[float] = field(default_factory=list)
    tree_ranks: list[int] = field(default_factory=list)
    tree_path: list[int] = field(default_factory=list)
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
    reused_tokens: int = 0  # prompt tokens taken from the previous run's caches (engine/decode/prefix_cache.py)
    num_plain_steps: int = 0  # auto's plain steps (not counted in num_rounds)
    mean_round_ms: float | None = None  # a round's wall time, plain steps left out
    type: str = "summary"

    @property
    def timed(self) -> bool:
        """Whether the run decoded past its first token (the prefill's): only then is there a decode
        to time. One token over almost no time read as thousands of tok/s (EOS at once, --max-tokens 1,
        or a Stop right after the prefill)."""
        return self.num_generated >= MIN_TOKENS_FOR_SPEED

    @property
    def ended_at_once(self) -> bool:
        """The target's first token (the prefill's) was EOS: nothing was decoded or drafted, and a
        rate of one token over no time would be no speed."""
        return self.stop_reason == "eos" and self.num_generated <= 1


# A run has a speed once it decoded past the prefill's token (SummaryEvent.timed); CLI and window alike.
MIN_TOKENS_FOR_SPEED = 2


def nothing_to_time(max_tokens: int, what: str, setting: str = "max tokens") -> Optional[str]:
    """Why `what` (a bench, a race), which times decoding, cannot run at `max_tokens` (named as the user
    set it: `setting`); None when it can."""
    if max_tokens >= MIN_TOKENS_FOR_SPEED:
        return None
    return (f"{what} times decoding: {setting} {max_tokens} leaves nothing to time (the first token is the "
            f"prefill's); give at least {MIN_TOKENS_FOR_SPEED}.")
# What a run with one token that did not end at once says instead of a rate.
NOT_TIMED = "only the prefill's token was written (max tokens 1, or stopped after it), so there was no decoding to time"

# What a run that ended at once says, CLI and window alike: that ending is the target's, not DFlash's,
# and a prompt that ends at a line end can meet it where the target's training files ended so.
ENDED_AT_ONCE = ("the target wrote EOS as its first token, so there was nothing to decode or draft (a prompt "
                 "ending where the target's training texts ended, as at a line end, can do this: write on, or "
                 "end it mid-line)")


Event = Union[StartEvent, CalibrationEvent, PrefillEvent, RoundEvent, TextEvent, SummaryEvent]
EVENT_TYPES = {cls.__dataclass_fields__["type"].default: cls
               for cls in (StartEvent, CalibrationEvent, PrefillEvent, RoundEvent, TextEvent, SummaryEvent)}


def to_dict(event: Event) -> dict[str, Any]:
    return asdict(event)


def field_of(record: Any, name: str, default: Any = None) -> Any:
    """A field of an event or of its trace record (a dict), for code that reads both."""
    return record.get(name, default) if isinstance(record, dict) else getattr(record, name, default)


def _is_int(v: Any) -> bool:
    return is_int(v)


def _is_number(v: Any) -> bool:
    return is_number(v) and v == v


# What each annotation (as written above) accepts in a record read back from a file.
_CHECKS = {
    "int": _is_int,
    "float": _is_number,
    "str": lambda v: isinstance(v, str),
    "Optional[str]": lambda v: v is None or isinstance(v, str),
    "int | None": lambda v: v is None or _is_int(v),
    "Optional[int]": lambda v: v is None or _is_int(v),
    "float | None": lambda v: v is None or _is_number(v),
    "list[int]": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "list[float]": lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
    "dict[str, Any]": lambda v: isinstance(v, dict),
    "list[list[int]]": lambda v: isinstance(v, list) and all(_CHECKS["list[int]"](x) for x in v),
    "list[list[float]]": lambda v: isinstance(v, list) and all(_CHECKS["list[float]"](x) for x in v),
}


def _check_tree(values: dict[str, Any]) -> None:
    """A round's tree read back from a file: one entry per node in every field, each parent before its
    child, and the accepted path a walk down from the root."""
    parents, n, index = values["tree_parents"], len(values["tree_parents"]), values["index"]
    if any(len(values.get(f, [])) != n for f in ("tree_tokens", "tree_scores", "tree_ranks")):
        raise ValueError(f"round {index}'s tree fields hold different numbers of nodes")
    if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError(f"round {index}'s tree has a node whose parent does not come before it")
    path = values.get("tree_path", [])
    if not path or path[0] != 0 or any(not 0 <= b < n or parents[b] != a for a, b in zip(path, path[1:])):
        raise ValueError(f"round {index}'s accepted tree path is not a walk down from the root")


def from_dict(data: dict[str, Any]) -> Event:
    """The event a record holds; ValueError naming the field when a record (from a trace file:
    anything can be in it) is missing one or holds the wrong kind of value."""
    cls = EVENT_TYPES[data["type"]]
    values = {}
    for name, f in cls.__dataclass_fields__.items():
        if name not in data:
            if name == "type" or f.default is not MISSING or f.default_factory is not MISSING:
                continue  # added since older traces were written: the default stands
            raise ValueError(f"its {data['type']} record has no '{name}'")
        check = _CHECKS.get(str(f.type))
        if check is not None and not check(data[name]):
            raise ValueError(f"its {data['type']} record has '{name}' = {data[name]!r:.40}, not {f.type}")
        values[name] = data[name]
    if cls is RoundEvent and not 0 <= values["accepted"] <= len(values["drafted"]):
        raise ValueError(f"round {values['index']} accepted {values['accepted']} of {len(values['drafted'])} drafts")
    if cls is RoundEvent and values.get("tree_parents"):
        _check_tree(values)
    return cls(**values)
