"""Subcommands contributed by other parts of the project (trainer, window)."""

from __future__ import annotations

import argparse
from typing import Callable

EXTRA_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def register_extra_commands(sub) -> None:
    from engine.training.cli import add_parser, cmd_train_drafter

    add_parser(sub)
    EXTRA_COMMANDS["train-drafter"] = cmd_train_drafter
