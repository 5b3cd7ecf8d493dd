"""What a finished run tells its client: token counts, and the speculative figures in one extra field."""

from __future__ import annotations

import json
from typing import Any, Optional

from engine.decode.events import SummaryEvent

FIELD = "dflash"  # the extra field every response (and a stream's last chunk) carries


def speculative(summary: SummaryEvent, timing: Optional[dict[str, float]] = None) -> dict[str, Any]:
    """Rounds, tau (tokens a round committed), tok/s, and target forwards saved against AR (AR
    writes a token a forward after the prefill's; a round or auto's plain step is one forward);
    with `timing`, the run's wait in the queue and its time in the engine."""
    forwards = summary.num_rounds + summary.num_plain_steps if summary.mode != "ar" else summary.num_generated - 1
    return {
        "mode": summary.mode,
        "rounds": summary.num_rounds,
        "plain_steps": summary.num_plain_steps,
        "tau": summary.mean_acceptance_length,
        "tok_per_s": summary.tok_per_s if summary.timed else None,
        "ar_steps_saved": max(0, summary.num_generated - 1 - forwards),
        "prefill_s": summary.prefill_s,
        "decode_s": summary.decode_s,
        "cached_tokens": summary.reused_tokens,
        "stop_reason": summary.stop_reason,
        **(timing or {}),
    }


def matched_stop(summary: SummaryEvent, tokenizer, stops: list[str]) -> Optional[str]:
    """The stop string the run ended at (its text is cut where it begins), or None."""
    if summary.stop_reason != "stop_string":
        return None
    whole = tokenizer.decode(summary.token_ids)
    return next((s for s in stops if whole.startswith(s, len(summary.text))), stops[0] if stops else None)


def sse(data: Any, event: Optional[str] = None) -> str:
    """One server-sent event (`event:` line for Anthropic's stream, none for OpenAI's)."""
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {body}\n\n"
