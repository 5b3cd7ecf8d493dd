"""The `dflash-playground` console script: the engine's subcommands, `train-drafter`, `serve`, and `gui`.

This is the top of the house: it wires the engine's commands (engine/tools/cli.py), the
trainer's (engine/training/cli.py) and the window (app/main.py, imported lazily so the
command line never loads Qt). With no subcommand it opens the window.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from engine.decode.settings import DEFAULTS
from engine.tools.cli import COMMANDS
from engine.tools.cli_run import run_command
from engine.tools.cli_parser import build_parser
from engine.serve.cli import add_parser as add_serve_parser
from engine.serve.cli import cmd_serve
from engine.training.cli import add_parser as add_train_parser
from engine.training.cli import cmd_train_drafter


def cmd_gui(args: argparse.Namespace) -> int:
    """Open the window (also what no subcommand does). Qt is imported only here."""
    from app.main import run_gui

    return run_gui(args)


def _add_gui_parser(sub) -> None:
    g = sub.add_parser("gui", help="open the window (the default with no command)")
    g.add_argument("trace", nargs="?", metavar="TRACE.jsonl",
                   help="a saved trace to open (a run, or a parity check's two runs and verdict), or a model "
                        "folder to pick")
    g.add_argument("--screenshot", metavar="FILE.png", help="render the window to a PNG and exit")
    g.add_argument("--run-demo", action="store_true",
                   help="with --screenshot: run the demo prompt in Both mode to completion first")
    g.add_argument("--tree-round", action="store_true",
                   help="with --screenshot: show in the Tree tab the tree round where the tree beat the chain by "
                        "most (of the trace opened, or of --run-demo's run, which then has auto tree on)")
    g.add_argument("--target", help="target to preselect (and for --run-demo when the demo pair is absent)")
    g.add_argument("--drafter", help="drafter to preselect")
    g.add_argument("--max-tokens", type=int, default=DEFAULTS.max_tokens,
                   help=f"max tokens for --run-demo (default {DEFAULTS.max_tokens})")


def _add_parsers(sub) -> None:
    add_train_parser(sub)
    add_serve_parser(sub)
    _add_gui_parser(sub)


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser(_add_parsers)
    args = parser.parse_args(argv)
    if args.command is None:  # a double-click or a bare `dflash-playground`: the window
        args.command = "gui"
    handlers = {**COMMANDS, "train-drafter": cmd_train_drafter, "serve": cmd_serve, "gui": cmd_gui}
    return run_command(parser, args, handlers)


if __name__ == "__main__":
    sys.exit(main())
