"""Reading user-supplied text and JSONL files with one-sentence errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from engine import json_text
from engine.errors import DFlashError

UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")


def read_text(path: str | Path, what: str, no_nul: bool = False) -> str:
    """The file's text; `what` names it in the error ("the prompts file"). UTF-8, or UTF-16 where the
    file starts with its byte-order mark (Windows' "Unicode"); a UTF-8 byte-order mark (Windows editors
    write one) is dropped, as editors do: it was prompt text, three tokens of it. Line ends become
    "\n". `no_nul`: a NUL byte is refused (a UTF-16 file without its mark reads as UTF-8 with a NUL
    after every letter: a prompt of junk tokens, and no word said)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DFlashError(f"{path}: cannot read {what} ({exc.strerror or exc}).") from None
    try:
        text = data.decode("utf-16" if data.startswith(UTF16_MARKS) else "utf-8-sig")
    except UnicodeDecodeError:
        raise DFlashError(f"{path}: {what} is not UTF-8 text.") from None
    if no_nul and "\0" in text:
        raise DFlashError(f"{path}: {what} holds NUL characters, so it is not plain text (UTF-16 without its "
                          "byte-order mark?); save it as UTF-8.")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def jsonl_strings(path: str | Path, field: str, what: str, or_list: Optional[str] = None) -> list[Any]:
    """The string `field` of every non-empty line of a JSONL file; with `or_list`, a line may hold a
    non-empty list under that name instead (the list is returned for it)."""
    values = []
    for n, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json_text.loads(line)
        except ValueError:
            raise DFlashError(f"{path}: line {n} is not JSON; expected {{\"{field}\": \"...\"}} per line.") from None
        if isinstance(record, dict) and or_list and isinstance(record.get(or_list), list) and record[or_list]:
            values.append(record[or_list])
            continue
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            also = f" or a non-empty list '{or_list}'" if or_list else ""
            raise DFlashError(f"{path}: line {n} has no string field '{field}'{also}.")
        values.append(record[field])
    return values
