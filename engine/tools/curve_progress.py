"""The cost curve a command's auto runs need, measured before they start, with progress on stderr."""

from __future__ import annotations

import sys
import time

PREFIX = "  auto verify length: this machine's cost curve for this pair, "
LOG_PROGRESS_S = 5.0  # stderr not a terminal (a log file): a progress line this often, not a line rewritten


def measure_cost_curves(pair, settings: list) -> None:
    """A first --block-size auto run measures this machine's cost curve (cached after, per pair, block
    and draft window; for a sharded target, per loaded pair): measured here first, with progress on stderr
    (rank 0's), instead of a silent wait inside the run (seconds on the demo pair, minutes for a large
    vocabulary on a CPU)."""
    from engine.decode.cost_curve import cost_curve
    from engine.decode.speculative import verify_block
    from engine.runtime.distributed import heartbeat

    live, said, last = sys.stderr.isatty(), [float("-inf")], [""]

    def say(msg: str) -> None:  # a line rewritten in a terminal; in a log, a line every few seconds
        last[0] = msg
        heartbeat("measuring the cost curve")  # the ranks of a sharded run measure it together
        if live:
            print(f"\r{PREFIX}{msg}", end="", file=sys.stderr, flush=True)
        elif time.monotonic() - said[0] >= LOG_PROGRESS_S:
            said[0] = time.monotonic()
            print(f"{PREFIX}{msg}", file=sys.stderr, flush=True)

    for s in settings:
        s = s.resolved(pair)
        if s.mode == "ar" or not s.auto:
            continue
        _, cached = cost_curve(pair, block=verify_block(s), window=s.draft_window, sink=s.draft_sink, progress=say,
                               sampling=s.sampling)
        if not cached:
            print(", done" if live else f"{PREFIX}{last[0] or 'measured'}, done", file=sys.stderr, flush=True)
