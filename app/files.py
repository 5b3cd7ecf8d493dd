"""Exports (trace JSONL, Chrome trace, rounds CSV) and opening a saved trace. No Qt here."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

from engine.errors import DFlashError
from engine.safe_write import check_output, write_atomic
from engine.tools.trace import RUNS_SCHEMA, SCHEMA, chrome_events, parity_record, read_runs
from app.jobs import ParityDone
from app.run_record import RunRecord, record_from_trace
from app.tokens import TokenTable, table_from_tokenizer_json

Inputs = tuple[Optional[str | Path], ...]  # files an export must not be written over

ROUND_COLUMNS = ("index", "position", "anchor", "drafted", "accepted", "bonus", "bonus_kind", "committed",
                 "draft_ms", "verify_ms", "rollback_ms", "t", "generated")


def _header(run: RunRecord) -> dict:
    if run.header is None:
        raise DFlashError("this run has no trace header to export.")
    return run.header


def write_checked(path: Path, text: str, what: str, inputs: Inputs) -> None:
    """Checked first (never over `inputs`: the trace on show), then written beside the file and renamed
    over it (engine/safe_write.py)."""
    write_atomic(check_output(path, what, inputs), text, what)


@dataclass
class Comparison:
    """A Both run's two runs and its verdict: what a parity trace holds (dflash is None when Stop ended
    the AR run; parity None when the check did not finish: a crash, Ctrl-C, a run that failed)."""

    ar: RunRecord
    dflash: Optional[RunRecord]
    parity: Optional[ParityDone]

    @property
    def runs(self) -> list[RunRecord]:
        return [self.ar] + ([self.dflash] if self.dflash is not None else [])


def export_trace(run: RunRecord | Comparison, path: str | Path, inputs: Inputs = ()) -> int:
    """Write one run as dflash-trace/1 JSONL (the header the engine made, then its records), or a
    comparison as dflash-trace/2 (each run so, then the parity record). Returns the records written."""
    if isinstance(run, Comparison):
        lines = []
        for each in run.runs:
            lines += [json.dumps({**_header(each), "schema": RUNS_SCHEMA})] + [json.dumps(r) for r in each.records()]
        if run.parity is not None:
            done = asdict(run.parity)  # no DFlash speed where DFlash did not run (the window keeps 0.0 there)
            done["dflash_tok_s"] = done["dflash_tok_s"] if run.dflash is not None else None
            lines.append(json.dumps(parity_record(done)))
    else:  # one run, whatever file it was opened from
        lines = [json.dumps({**_header(run), "schema": SCHEMA})] + [json.dumps(r) for r in run.records()]
    write_checked(Path(path), "\n".join(lines) + "\n", "the trace", inputs)
    return len(lines)


def export_chrome(run: RunRecord | Comparison, path: str | Path, inputs: Inputs = ()) -> int:
    """Chrome trace JSON (opens in Perfetto), via the engine's converter: a comparison's runs as two processes."""
    runs = run.runs if isinstance(run, Comparison) else [run]
    events = [e for pid, each in enumerate(runs, 1) for e in chrome_events(_header(each), each.records(), pid)]
    write_checked(Path(path), json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}), "the Chrome trace", inputs)
    return len(events)


def export_rounds_csv(run: RunRecord | Comparison, path: str | Path, inputs: Inputs = ()) -> int:
    """One row per round (a comparison's: its DFlash run's); id lists are space-separated, times to 6 decimals."""
    if isinstance(run, Comparison):
        if run.dflash is None:
            raise DFlashError("this comparison has no DFlash run (Stop ended the AR run), so it has no rounds.")
        run = run.dflash
    buffer = io.StringIO(newline="")
    w = csv.writer(buffer)
    w.writerow(ROUND_COLUMNS)
    for r in run.rounds:
        row = []
        for col in ROUND_COLUMNS:
            v = getattr(r, col)
            # floats to the microsecond: a sum's binary noise read "36.757999999999996"
            row.append(" ".join(map(str, v)) if isinstance(v, list) else round(v, 6) if isinstance(v, float) else v)
        w.writerow(row)
    write_checked(Path(path), buffer.getvalue(), "the rounds CSV", inputs)
    return len(run.rounds)


def unfinished(run: RunRecord | Comparison, path: str | Path) -> Optional[str]:
    """What an opened trace lacks, if anything: a run still ends with its summary, a stopped one too,
    and a parity check with its verdict."""
    name = Path(path).name
    for each in run.runs if isinstance(run, Comparison) else [run]:
        if each.summary is None:
            made = f"{len(each.rounds)} rounds" if each.rounds else f"{len(each.tokens)} tokens"
            which = f": its {'AR' if each.mode == 'ar' else 'DFlash'} run" if isinstance(run, Comparison) else ""
            return (f"{name}{which} ends after {made}, without the run's summary: the run did not finish "
                    "(a crash, a command stopped with Ctrl-C) or the file was cut short; its totals are missing.")
    if isinstance(run, Comparison) and run.parity is None:
        return (f"{name}: this parity check did not finish, so the file has no verdict" +
                ("" if run.dflash is not None else " and no DFlash run") + ".")
    return None


def _parity_done(record: dict, ar: RunRecord, dflash: Optional[RunRecord]) -> ParityDone:
    """The window's ParityDone from a parity record (engine.tools.trace checked it against the runs); whether
    both ended at their first token, and whether both were timed, come from the runs' summaries (older
    traces' records do not say, and a record of one-token runs has no speedup)."""
    names = {f.name for f in fields(ParityDone)}
    values = {k: v for k, v in record.items() if k in names}
    at_once = all(r is not None and r.summary is not None and r.summary.ended_at_once for r in (ar, dflash))
    timed = values.get("speedup") is not None and all(r is not None and r.summary is not None and r.summary.timed
                                                      for r in (ar, dflash))
    return ParityDone(**{**values, "dflash_tok_s": values.get("dflash_tok_s") or 0.0, "dflash_ran": dflash is not None,
                         "ended_at_once": at_once, "timed": timed})


def open_trace(path: str | Path, table: Optional[TokenTable] = None) -> RunRecord | Comparison:
    """Read a trace into a record, a parity check's into a Comparison (without a verdict when the check
    did not finish); the token table comes from the target's tokenizer.json when it still exists."""
    trace = read_runs(path)
    runs = trace.runs
    if table is None:
        table = table_from_tokenizer_json(runs[0].header.get("target"))
    try:
        records = [record_from_trace(r.header, r.records, table) for r in runs]
    except (TypeError, KeyError, ValueError, IndexError) as exc:
        raise DFlashError(f"{path}: a record does not match {runs[0].header['schema']} ({type(exc).__name__}: "
                          f"{exc}).") from None
    if runs[0].header["schema"] == SCHEMA:
        return records[0]
    dflash = records[1] if len(records) > 1 else None  # engine.tools.trace checked the runs' order
    parity = _parity_done(trace.parity, records[0], dflash) if trace.parity is not None else None
    return Comparison(records[0], dflash, parity)
