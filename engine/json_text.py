"""JSON that users give us (configs, traces, prompt files, settings), parsed with one kind of failure.

`json.loads` fails in more ways than JSONDecodeError: nesting deeper than the interpreter's
recursion limit raises RecursionError, an integer of more than 4300 digits a plain ValueError.
Callers catch ValueError here and turn it into their own one-sentence error.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """json.loads, every failure a ValueError whose message says what was wrong."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


def is_int(value: Any) -> bool:
    """An integer, and not a bool (JSON's true is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
