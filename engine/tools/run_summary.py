"""The line `generate` prints (on stderr) after a run's text."""

from __future__ import annotations

from engine.decode.events import ENDED_AT_ONCE, NOT_TIMED, SummaryEvent


def summary_line(summary: SummaryEvent) -> str:
    """Tokens, speed, tau and rounds, prefill time and why it stopped; a run that ended at its first
    token, or wrote no other, says so instead of a rate (one token over no decoding time read as 21,000
    tok/s)."""
    if summary.ended_at_once:
        return f"[{summary.mode}: {ENDED_AT_ONCE}; prefill {summary.prefill_s:.3f}s]"
    if not summary.timed:
        return (f"[{summary.mode}: {summary.num_generated} token, no speed: {NOT_TIMED}; prefill "
                f"{summary.prefill_s:.3f}s, stop: {summary.stop_reason}]")
    rounds = f", {summary.num_rounds} rounds" if summary.num_rounds else ""
    if summary.num_plain_steps:
        rounds += f", {summary.num_plain_steps} plain steps"
    if summary.mean_acceptance_length is not None:  # None when no round drafted (block size 1)
        rounds = f", tau {summary.mean_acceptance_length:.2f}{rounds}"
    tokens = f"{summary.num_generated} token" + ("s" if summary.num_generated != 1 else "")
    return (f"[{summary.mode}: {tokens}, {summary.tok_per_s:.1f} tok/s{rounds}, "
            f"prefill {summary.prefill_s:.3f}s, stop: {summary.stop_reason}]")
