"""The status lines the run controller shows: a run's progress (prefill, the cost curve's
measurement) and its end."""

from __future__ import annotations

from typing import Optional

from engine.decode.events import PrefillEvent, SummaryEvent
from engine.json_text import is_int


def done_message(s: SummaryEvent, after_ar: bool = False) -> str:
    """The status line after a run: short enough for a laptop's status bar beside the figures (tok/s,
    tau and tokens have labels of their own there), with how much of the prompt was reused (`after_ar`:
    Both mode's DFlash half, whose reuse is the AR half's prefill, not an earlier run's)."""
    tokens = f"{s.num_generated:,} token" + ("s" if s.num_generated != 1 else "")
    if s.stop_reason == "cancelled":  # in the prefill or the cost curve's measurement: no token yet
        head = f"{s.mode}: stopped " + (f"after {tokens}" if s.num_generated else "before its first token")
    elif s.ended_at_once:  # no speed to show: say why nothing came, in the words a status bar has room for
        head = f"{s.mode}: the target wrote EOS first; write on, or end the prompt mid-line"
    else:
        head = f"{s.mode}: {tokens}, {s.stop_reason}"
    if not s.reused_tokens:
        return head
    return head + f"; prompt reused {s.reused_tokens:,}/{s.prompt_tokens:,}" + (" from the AR run" if after_ar else "")


def calibration_left_s(done: int, total: int, elapsed_s: float) -> Optional[float]:
    """Seconds the cost curve's measurement has left at the pace since its first step (None before a
    pace is known: the first step includes compiling)."""
    if done < 2 or total <= done:
        return None
    return elapsed_s / (done - 1) * (total - done)


def calibration_message(run) -> str:
    """What the strip above the tabs says while the cost curve is measured for `run` (its RunRecord)."""
    settings = run.start.settings if run is not None else {}
    block, window = settings.get("block_size"), settings.get("draft_window")
    at = ", ".join(part for part in (f"block {block}" if block else "", f"draft window {window}" if window else "")
                   if part)
    return ("Auto verify length: measuring this machine's cost curve" + (f" ({at})" if at else "")
            + ", once per pair and setting; later runs read it from the cache")


def prefill_message(label: str, event: PrefillEvent) -> str:
    """The status line while the prompt runs through the target."""
    reused = f" ({event.reused:,} reused)" if event.reused else ""
    return f"{label}: prompt {event.done:,} / {event.total:,} tokens{reused}"


def advice_note(advice: Optional[dict], replayed_on: Optional[str]) -> str:
    """What the Why tab adds to the advice: whose cost curve it read (`replayed_on`: the loaded target,
    for a trace's rounds), and the copies the advisor left out."""
    note = f" The cost curve is the loaded pair's ({replayed_on}) on this machine." if replayed_on else ""
    copies = advice["copies"] if advice else 0
    if copies:  # the advice is the drafter's: the advisor left the copies out
        note += (f" The {copies} rounds that verified a copy of the context are left out: this is what "
                 "the drafter's blocks alone would give.")
    return note


def count_setting(value) -> int:
    """A trace's window or sink setting (absent in older traces, anything in a hand-edited one)."""
    return value if is_int(value) and value >= 0 else 0
