"""Subcommands contributed by other parts of the project (trainer, window), registered lazily."""

from __future__ import annotations

import argparse
from typing import Callable

EXTRA_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def register_extra_commands(sub) -> None:
    """Hook for commands defined outside engine.cli; each adds a parser and a handler."""
