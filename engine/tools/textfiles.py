"""Reading user-supplied text and JSONL files with one-sentence errors."""

from __future__ import annotations

from pathlib import Path

from engine import json_text
from engine.errors import DFlashError


def read_text(path: str | Path, what: str) -> str:
    """The file's UTF-8 text; `what` names it in the error ("the prompts file"). A byte-order mark
    (Windows editors write one) is dropped, as editors do: it was prompt text, three tokens of it."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DFlashError(f"{path}: cannot read {what} ({exc.strerror or exc}).") from None
    except UnicodeDecodeError:
        raise DFlashError(f"{path}: {what} is not UTF-8 text.") from None


def jsonl_strings(path: str | Path, field: str, what: str) -> list[str]:
    """The string `field` of every non-empty line of a JSONL file."""
    values = []
    for n, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json_text.loads(line)
        except ValueError:
            raise DFlashError(f"{path}: line {n} is not JSON; expected {{\"{field}\": \"...\"}} per line.") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise DFlashError(f"{path}: line {n} has no string field '{field}'.")
        values.append(record[field])
    return values
