"""Exports (trace JSONL, Chrome trace, rounds CSV) and opening a saved trace. No Qt here."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional

from engine.errors import DFlashError
from engine.safe_write import check_output, write_atomic
from engine.tools.trace import SCHEMA, chrome_events, read_trace
from app.run_record import RunRecord, record_from_trace
from app.tokens import TokenTable, table_from_tokenizer_json

ROUND_COLUMNS = ("index", "position", "anchor", "drafted", "accepted", "bonus", "bonus_kind", "committed",
                 "draft_ms", "verify_ms", "rollback_ms", "t", "generated")


def _header(run: RunRecord) -> dict:
    if run.header is None:
        raise DFlashError("this run has no trace header to export.")
    return run.header


def _write(path: Path, text: str, what: str) -> None:
    """Checked first, then written beside the file and renamed over it (engine/safe_write.py)."""
    write_atomic(check_output(path, what), text, what)


def export_trace(run: RunRecord, path: str | Path) -> int:
    """Write the run as dflash-trace/1 JSONL (the header the engine made, then its records)."""
    records = run.records()
    lines = [json.dumps(_header(run))] + [json.dumps(r) for r in records]
    _write(Path(path), "\n".join(lines) + "\n", "the trace")
    return len(records)


def export_chrome(run: RunRecord, path: str | Path) -> int:
    """Chrome trace JSON (opens in Perfetto), via the engine's converter."""
    events = list(chrome_events(_header(run), run.records()))
    _write(Path(path), json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}), "the Chrome trace")
    return len(events)


def export_rounds_csv(run: RunRecord, path: str | Path) -> int:
    """One row per round; id lists are space-separated."""
    buffer = io.StringIO(newline="")
    w = csv.writer(buffer)
    w.writerow(ROUND_COLUMNS)
    for r in run.rounds:
        row = []
        for col in ROUND_COLUMNS:
            v = getattr(r, col)
            row.append(" ".join(map(str, v)) if isinstance(v, list) else v)
        w.writerow(row)
    _write(Path(path), buffer.getvalue(), "the rounds CSV")
    return len(run.rounds)


def unfinished(run: RunRecord, path: str | Path) -> Optional[str]:
    """What an opened trace lacks, if anything: a run still ends with its summary, a stopped one too."""
    if run.summary is not None:
        return None
    made = f"{len(run.rounds)} rounds" if run.rounds else f"{len(run.tokens)} tokens"
    return (f"{Path(path).name} ends after {made}, without the run's summary: the run did not finish (a crash, a "
            "command stopped with Ctrl-C) or the file was cut short; its totals are missing.")


def open_trace(path: str | Path, table: Optional[TokenTable] = None) -> RunRecord:
    """Read a trace into a record; the token table comes from the target's tokenizer.json when it still exists."""
    header, records = read_trace(path)
    if header.get("schema") != SCHEMA:
        raise DFlashError(f"{path}: schema {header.get('schema')!r} is not {SCHEMA!r}.")
    if table is None:
        table = table_from_tokenizer_json(header.get("target"))
    try:
        return record_from_trace(header, records, table)
    except (TypeError, KeyError, ValueError, IndexError) as exc:
        raise DFlashError(f"{path}: a record does not match {SCHEMA} ({type(exc).__name__}: {exc}).") from None
