"""Running one subcommand: one error line and exit 2 for bad input, and the ranks of an
`mlx.launch` job joined, watched and silenced so that rank 0 alone speaks for the job."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from typing import Callable, Optional

from engine.errors import DFlashError
from engine.runtime import distributed

EXIT_ERROR = 2


# Commands that run across the ranks of an `mlx.launch` job.
SHARDABLE = ("generate", "parity", "bench", "calibrate")


def _join(args: argparse.Namespace) -> Optional[distributed.Watchdog]:
    """Under `mlx.launch`: join the group (args.ranks), arm a watchdog, make SIGTERM say why."""
    if distributed.launched_backend() is None:
        return None
    if args.command not in SHARDABLE:
        raise DFlashError(f"`{args.command}` runs in one process; under mlx.launch run one of "
                          f"{', '.join(SHARDABLE)}.")
    # As the group stands: a rank that fails at once makes mlx.launch end this one, often before
    # join() has returned (seen: rank 0 silent, exit -15, 3 runs in 40).
    args.ranks = distributed.join(joined=lambda: signal.signal(signal.SIGTERM, _terminated))
    if not args.ranks.sharded:
        return None
    watchdog = distributed.Watchdog(args.ranks.rank)
    watchdog.expect(distributed.LOAD_TIMEOUT_S, "loading the models")
    distributed.arm(watchdog)
    return watchdog


def _terminated(signum, frame) -> None:
    """mlx.launch ends the other ranks when one fails: rank 0 still says why, once, and every
    rank exits 2 (not -15)."""
    if distributed.launched_rank() == 0:
        _say("error: stopped by mlx.launch because another rank failed (see its \"Node with rank N "
             "exited\" lines).")
    os._exit(EXIT_ERROR)


_SPOKE = False  # this command printed its error line already


def _say(line: Optional[str]) -> None:
    """Print an error line, at most one per command (a SIGTERM during a sharded run must not add a second)."""
    global _SPOKE
    # mlx.launch's SIGTERM can land mid-line: its handler (which says a line too, unless this one was
    # said) waits until the line is out, so the job ends with exactly one (seen: none, 1 run in 45).
    masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        if line and not _SPOKE:
            print(line, file=sys.stderr, flush=True)
            _SPOKE = True
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, masked)


def _error_line(args: argparse.Namespace, exc: BaseException) -> Optional[str]:
    """The one line this rank prints for `exc`, or None where rank 0 speaks for the job."""
    ranks = args.ranks
    text = " ".join(str(exc).split())
    if not ranks.sharded:
        return f"error: {text}"
    if not ranks.root:
        return None  # every rank meets the same inputs; rank 0 speaks for the job
    if distributed.peer_lost(exc):
        return ("error: lost the connection to another rank (it stopped, or the link dropped); to see why, "
                "run the same command on that host without mlx.launch.")
    return f"error: {text}"


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace,
                handlers: dict[str, Callable[[argparse.Namespace], int]]) -> int:
    """Run the chosen handler; a DFlashError is one line and exit 2, a bug one line unless --debug."""
    global _SPOKE
    handler = handlers.get(args.command)
    watchdog = None
    sigterm = signal.getsignal(signal.SIGTERM)  # _join replaces it under mlx.launch
    _SPOKE = False  # one error line per command (tests and embedders run many in one process)
    succeeded = False
    vars(args).setdefault("ranks", distributed.SINGLE)  # _join() sets the ranks of an mlx.launch job
    try:
        if handler is None:
            parser.print_help()
            return 0
        watchdog = _join(args)
        if watchdog is None or args.ranks.root:
            code = handler(args)
        else:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                code = handler(args)  # rank 0 prints (and reports progress) for the job
        succeeded = code == 0
        return code
    except (DFlashError, RuntimeError) as exc:
        if not isinstance(exc, DFlashError) and not distributed.peer_lost(exc):
            return _unexpected(args, exc)
        if args.debug:
            traceback.print_exc()
        _say(_error_line(args, exc))  # one line, always
        _let_root_report(args, exc)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted.", file=sys.stderr)
        return 130
    except Exception as exc:  # an engine bug, not user input: still one line unless --debug
        return _unexpected(args, exc)
    finally:
        if watchdog is not None:
            watchdog.stop()
            distributed.arm(None)
        if succeeded:  # a failed rank is on its way out: mlx.launch's SIGTERM now must still end it with 2
            signal.signal(signal.SIGTERM, sigterm)


ROOT_REPORT_GRACE_S = 30.0


def _let_root_report(args: argparse.Namespace, exc: BaseException) -> None:
    """A silent rank waits (for mlx.launch's SIGTERM once rank 0 has failed too) before it exits.

    Every rank meets the same refusal, but the first to exit makes mlx.launch stop the rest: had
    rank 1 exited first, rank 0 would be stopped before printing the reason."""
    ranks = args.ranks
    if ranks.sharded and not ranks.root and not distributed.peer_lost(exc):
        time.sleep(ROOT_REPORT_GRACE_S)  # the SIGTERM handler exits at once; this only bounds the wait


def _unexpected(args: argparse.Namespace, exc: BaseException) -> int:
    from engine.runtime.temp_dir import explain

    if args.debug:
        traceback.print_exc()
    known = explain(exc)  # the user's environment, not our bug
    print(f"error: {known}" if known else
          f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
    return EXIT_ERROR
