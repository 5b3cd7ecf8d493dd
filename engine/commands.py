"""Subcommands contributed by other parts of the project (trainer, window)."""

from __future__ import annotations

import argparse
from typing import Callable

EXTRA_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def cmd_gui(args: argparse.Namespace) -> int:
    """Open the window (also what no subcommand does). Qt is imported only here, lazily."""
    from app.main import run_gui

    return run_gui(args)


def _add_gui_parser(sub) -> None:
    g = sub.add_parser("gui", help="open the window (the default with no command)")
    g.add_argument("--screenshot", metavar="FILE.png", help="render the window to a PNG and exit")
    g.add_argument("--run-demo", action="store_true",
                   help="with --screenshot: run the demo prompt in Both mode to completion first")
    g.add_argument("--target", help="target to preselect (and for --run-demo when the demo pair is absent)")
    g.add_argument("--drafter", help="drafter to preselect")
    g.add_argument("--max-tokens", type=int, help="max tokens for --run-demo (default 96)")


def register_extra_commands(sub) -> None:
    from engine.training.cli import add_parser, cmd_train_drafter

    add_parser(sub)
    EXTRA_COMMANDS["train-drafter"] = cmd_train_drafter
    _add_gui_parser(sub)
    EXTRA_COMMANDS["gui"] = cmd_gui
