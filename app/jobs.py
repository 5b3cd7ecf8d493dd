"""What crosses between the window and the worker thread: plain Python data only.

Jobs go to the worker through a queued Qt signal; messages come back through a
thread-safe queue that the window drains on a timer, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from engine.decode.events import Event
from engine.decode.cancel import CancelToken
from engine.decode.settings import GenerationSettings


@dataclass(frozen=True)
class LoadJob:
    target: str
    drafter: Optional[str]
    cancel: CancelToken = field(default_factory=CancelToken, compare=False)
    kind: str = "load"


@dataclass(frozen=True)
class RunJob:
    prompt: str
    chat: Optional[bool]  # None: the chat template when the tokenizer has one
    thinking: Optional[bool]
    mode: str  # "dflash", "ar" or "both"
    settings: GenerationSettings
    load: Optional[LoadJob] = None  # load this pair first (the window asks when the pickers changed)
    cancel: CancelToken = field(default_factory=CancelToken, compare=False)
    kind: str = "run"


@dataclass(frozen=True)
class RaceJob:
    """The prompt decoded by each method in turn (engine/tools/race.py's names, AR first), with the
    window's settings; `settings` carries the draft model and its draft count for draft-model."""

    prompt: str
    chat: Optional[bool]
    thinking: Optional[bool]
    methods: tuple[str, ...]
    settings: GenerationSettings
    load: Optional[LoadJob] = None
    cancel: CancelToken = field(default_factory=CancelToken, compare=False)
    kind: str = "race"


@dataclass(frozen=True)
class AdviseJob:
    """The block-size advisor on a run's rounds (trace records), with the loaded pair's cost curve."""

    rounds: list[dict[str, Any]]
    decode_s: float
    ar_tok_s: Optional[float]  # measured AR speed when the run had an AR twin (Both mode)
    block: Optional[int]  # the block size the run used (None: the drafter's)
    draft_window: int = 0  # the run's drafter context (its settings), which the curve's drafts follow
    draft_sink: int = 0
    sampling: Optional[dict[str, Any]] = None  # the run's sampling settings: the curve times its draws
    cancel: CancelToken = field(default_factory=CancelToken, compare=False)
    kind: str = "advise"


@dataclass(frozen=True)
class ShutdownJob:
    """Drop every MLX object on the worker thread, then end its event loop."""

    cancel: CancelToken = field(default_factory=CancelToken, compare=False)
    kind: str = "shutdown"


# ---- worker -> window -------------------------------------------------------------------


@dataclass
class LoadProgress:
    stage: str
    frac: float


@dataclass
class PairInfo:
    target: str
    drafter: Optional[str]
    facts: dict[str, Any]
    device: str
    has_chat_template: bool
    has_thinking: bool
    token_table: list[str]
    vocab_size: int  # the target's logits: top-k ranges below it
    context: Optional[int] = None  # the target's context (max_position_embeddings): max tokens ranges up to it


@dataclass
class Loaded:
    info: PairInfo


@dataclass
class LoadFailed:
    message: str
    cancelled: bool
    kept: Optional["PairInfo"] = None  # the pair still loaded (the one before the failed load), if any


@dataclass
class EngineEvent:
    """An engine event of one run; `header` (the trace header) comes with the StartEvent."""

    label: str  # "ar" or "dflash"; in a race the method's name (engine.tools.race.METHODS)
    event: Event
    header: Optional[dict[str, Any]] = None


@dataclass
class ParityDone:
    identical: bool
    first_divergence: Optional[int]
    margin_at_divergence: Optional[float]
    speedup: Optional[float]  # None: not timed
    ar_tok_s: float
    dflash_tok_s: float
    cancelled: bool  # Stop ended a run: `identical` is over the `compared` tokens both runs wrote
    mean_acceptance_length: Optional[float] = None
    round_in_ar_steps: Optional[float] = None  # the tau at which DFlash breaks even
    compared: int = 0  # generated tokens the comparison covers
    dflash_ran: bool = True  # False: Stop ended the AR run and DFlash did not start
    ended_at_once: bool = False  # the target wrote EOS first in both runs: one token each, no speed to compare
    timed: bool = True  # both runs decoded past their first token (else their rates are no speed)


@dataclass
class MethodDone:
    """One method of a race ran to its end (or was stopped): the engine's figures against the race's AR
    run (engine.tools.bench.figures) and its comparison with AR's output."""

    method: str
    figures: dict[str, Any]
    identical: bool
    first_divergence: Optional[int]
    margin_at_divergence: Optional[float]  # AR's top-1 minus top-2 logit there, when both outputs reach it
    cancelled: bool


@dataclass
class RaceDone:
    methods: list[str]  # the methods that ran to their end, in order
    cancelled: bool


@dataclass
class AdviceReady:
    curve: dict[str, Any]  # engine.decode.cost_curve.CostCurve as a dict
    advice: Optional[dict[str, Any]]  # engine.decode.advisor.Advice.to_dict(); None without rounds


@dataclass
class RunFailed:
    message: str


@dataclass
class JobDone:
    job_id: int
    kind: str
    ok: bool
    cancelled: bool
