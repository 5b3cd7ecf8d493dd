"""Traces: JSONL, written and flushed per round, and Chrome trace export.

A trace of one run is schema dflash-trace/1: its header line, then its rounds, text and summary.
A parity check (the window's Both mode, `parity --trace`) is schema dflash-trace/2: the AR run
(header line, then its records), the DFlash run the same way, then one "parity" record, the
comparison's verdict (none when the check did not finish). A reader that knows only /1 refuses /2
by its schema instead of mixing the two runs.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from engine import json_text
from engine.errors import DFlashError
from engine.safe_write import check_output, replace_with, write_atomic
from engine.tools.textfiles import read_text
from engine.decode.events import (
    EVENT_TYPES, Event, RoundEvent, StartEvent, SummaryEvent, TextEvent, from_dict, to_dict,
)
from engine.json_text import is_int

SCHEMA = "dflash-trace/1"  # one run
RUNS_SCHEMA = "dflash-trace/2"  # several runs, each from its own header line, and their parity record
SCHEMAS = (SCHEMA, RUNS_SCHEMA)
# What a parity record holds (engine.tools.parity.ParityResult.to_dict(), the window's ParityDone): the
# verdict itself is recomputed from these, the runs' temperature and their logits dtype when read.
PARITY_FIELDS = {
    "identical": (bool,), "first_divergence": (int, type(None)), "margin_at_divergence": (float, int, type(None)),
    "cancelled": (bool,), "compared": (int,), "speedup": (float, int, type(None)), "ar_tok_s": (float, int),
    "dflash_tok_s": (float, int, type(None)), "mean_acceptance_length": (float, int, type(None)),
    "round_in_ar_steps": (float, int, type(None)),
}


def device_line() -> str:
    """Where runs here run, as traces record it (and the window's status bar says it)."""
    from engine.runtime import blas
    from engine.runtime.streams import device_kind

    return f"{device_kind()} ({platform.system()} {platform.machine()}, blas: {blas.status})"


def environment() -> dict[str, Any]:
    import mlx.core as mx
    import mlx_lm

    from engine import __version__

    return {
        "app_version": __version__,
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "device": device_line(),
    }


def _read_config(folder: Optional[str]) -> Optional[dict]:
    if not folder:
        return None
    try:
        return json_text.loads((Path(folder) / "config.json").read_bytes())
    except (OSError, ValueError):
        return None


def header_record(start: StartEvent, prompt: Optional[dict[str, Any]] = None,
                  schema: str = SCHEMA) -> dict[str, Any]:
    """A run's first line. `prompt`: {"text": ..., "format": "chat" | "raw" | "auto"} where the
    caller knows them, so an opened trace can show and re-run the prompt."""
    model = start.model
    return {
        "type": "header",
        "schema": schema,
        **environment(),
        "mode": start.mode,
        "target": model.get("target"),
        "drafter": model.get("drafter"),
        "target_config": _read_config(model.get("target")),
        "drafter_config": _read_config(model.get("drafter")),
        "model": model,
        "settings": start.settings,
        "prompt_ids": start.prompt_ids,
        **({"prompt": prompt} if prompt else {}),
    }


def parity_record(result: dict[str, Any]) -> dict[str, Any]:
    """The parity record of a dflash-trace/2 file, from a comparison's fields (ParityResult.to_dict())."""
    return {"type": "parity", **{key: result.get(key) for key in PARITY_FIELDS}}


class TraceWriter:
    """Writes one JSON line per record to FILE.<pid>.partial beside FILE, flushed as it goes (a
    crash leaves a valid prefix there); `close(complete=True)` renames it to FILE. An earlier FILE
    is never touched until the new trace is whole. `parity=True`: a parity check's trace (both runs,
    each StartEvent a header, then `write_parity`)."""

    def __init__(self, path: str | Path, prompt: Optional[dict[str, Any]] = None,
                 inputs: tuple[Optional[str | Path], ...] = (), parity: bool = False):
        self.schema = RUNS_SCHEMA if parity else SCHEMA
        self.path = check_output(path, "the trace", inputs)
        # One per process: never truncates another run's partial trace, nor one kept from a crash.
        self.partial = check_output(self.path.with_name(f"{self.path.name}.{os.getpid()}.partial"), "the trace",
                                    inputs)
        self.prompt = prompt
        self.records = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.partial, "w", encoding="utf-8")
        except OSError as exc:
            raise DFlashError(f"{self.path}: cannot write the trace ({exc.strerror}).") from None

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self.records += 1

    def write(self, event: Event) -> None:
        if isinstance(event, StartEvent):
            self._write(header_record(event, self.prompt, self.schema))
        elif isinstance(event, (RoundEvent, TextEvent, SummaryEvent)):
            self._write(to_dict(event))

    def write_parity(self, result: dict[str, Any]) -> None:
        """The comparison of the two runs written before it (ParityResult.to_dict())."""
        self._write(parity_record(result))

    def close(self, complete: bool = True) -> Optional[Path]:
        """Put the trace in place when the run ended; otherwise keep what was written as the partial file
        (or nothing, when nothing was). Returns where the trace is."""
        if self._file.closed:
            return None
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            if complete:
                replace_with(self.partial, self.path)
                return self.path
        except OSError as exc:
            self._file.close()
            raise DFlashError(f"{self.path}: cannot finish the trace ({exc.strerror or exc}); what was written "
                              f"is in {self.partial}.") from None
        if not self.records:
            self.partial.unlink(missing_ok=True)
            return None
        return self.partial

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(complete=exc_type is None)


@dataclass
class TraceRun:
    header: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TraceFile:
    runs: list[TraceRun]  # one (dflash-trace/1), or a parity check's AR run then its DFlash run
    parity: Optional[dict[str, Any]] = None  # the parity record, when the check finished

    @property
    def shown(self) -> TraceRun:
        """The run a one-run reader shows: the only one, or a parity check's DFlash run (its last)."""
        return self.runs[-1]


def _check_header(path, n: int, header: dict[str, Any], schema: str) -> None:
    if header.get("schema") != schema:
        raise DFlashError(f"{path}: line {n}: a run's header says schema {header.get('schema')!r} in a {schema} "
                          "trace; the trace is damaged.")
    for key, kind in (("mode", str), ("settings", dict), ("prompt_ids", list), ("model", dict), ("prompt", dict),
                      ("device", str), ("target", str), ("drafter", str)):
        if header.get(key) is not None and not isinstance(header[key], kind):
            raise DFlashError(f"{path}: line {n}: the header's '{key}' is not a {kind.__name__}; the trace is damaged.")
    if not all(is_int(i) for i in header.get("prompt_ids") or []):
        raise DFlashError(f"{path}: line {n}: the header's 'prompt_ids' are not all token ids; the trace is damaged.")


def _check_parity(path, n: int, record: dict[str, Any]) -> None:
    for key, kinds in PARITY_FIELDS.items():
        value = record.get(key)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise DFlashError(f"{path}: line {n}: the parity record's '{key}' is {value!r}; the trace is damaged.")


def read_runs(path: str | Path) -> TraceFile:
    """Every run in a trace, and a parity check's verdict. A torn last line (crash mid-write) is
    dropped; anything else is an error."""
    lines = read_text(path, "the trace").splitlines()
    records = []
    for n, line in enumerate(lines):
        try:
            record = json_text.loads(line)
        except ValueError:
            if n == len(lines) - 1:
                break
            raise DFlashError(f"{path}: line {n + 1} is not JSON; this is not a dflash trace.") from None
        if not isinstance(record, dict):
            raise DFlashError(f"{path}: line {n + 1} is not a JSON object; this is not a dflash trace.")
        records.append(record)
    if not records or records[0].get("type") != "header" or records[0].get("schema") not in SCHEMAS:
        raise DFlashError(f"{path}: no '{SCHEMA}' or '{RUNS_SCHEMA}' header on the first line; this is not a "
                          "dflash trace.")
    schema = records[0]["schema"]
    trace = TraceFile([])
    for n, record in enumerate(records, 1):  # every record a reader will use, checked once here
        kind = record.get("type")
        if trace.parity is not None and (kind == "header" or kind in EVENT_TYPES):
            raise DFlashError(f"{path}: line {n}: a run's record after the parity record; the trace is damaged.")
        if kind == "header":
            if trace.runs and schema == SCHEMA:
                raise DFlashError(f"{path}: line {n}: a second run in a {SCHEMA} trace (one run); the trace is "
                                  "damaged.")
            _check_header(path, n, record, schema)
            trace.runs.append(TraceRun(record))
        elif kind == "parity":
            if schema == SCHEMA:
                raise DFlashError(f"{path}: line {n}: a parity record in a {SCHEMA} trace (one run); the trace is "
                                  "damaged.")
            _check_parity(path, n, record)
            trace.parity = record
        else:
            if kind in EVENT_TYPES and kind != "start":
                try:
                    from_dict(record)
                except ValueError as exc:
                    raise DFlashError(f"{path}: line {n}: {exc}; the trace is damaged.") from None
            trace.runs[-1].records.append(record)
    if schema == RUNS_SCHEMA:
        _check_comparison(path, trace)
    return trace


def run_tokens(run: TraceRun) -> list[int]:
    """The token ids a run wrote: its summary's, or as its text records streamed them (a run cut short
    has no summary)."""
    summary = next((r for r in run.records if r.get("type") == "summary"), None)
    if summary is not None:
        return list(summary.get("token_ids") or [])
    return [t for r in run.records if r.get("type") == "text" for t in r.get("token_ids") or []]


def _check_comparison(path, trace: TraceFile) -> None:
    """A parity trace holds AR's run then (unless Stop ended AR's) DFlash's, and its verdict agrees with
    their tokens: whether they match, where they part, how many were compared (a stopped check: the
    tokens both wrote). Only AR's logit margin there cannot be checked without the model."""
    from engine.tools.parity import first_divergence

    modes = [r.header.get("mode") for r in trace.runs]
    if modes not in (["ar"], ["ar", "dflash"]):
        raise DFlashError(f"{path}: a parity trace holds an AR run and then a DFlash run, not "
                          f"{' then '.join(map(str, modes))}; the trace is damaged.")
    p = trace.parity
    if p is None:
        return
    a = run_tokens(trace.runs[0])
    b = run_tokens(trace.runs[1]) if len(trace.runs) > 1 else []
    stopped = p["cancelled"] or len(trace.runs) == 1
    n = min(len(a), len(b)) if stopped else max(len(a), len(b))
    where = first_divergence(a[:n], b[:n]) if stopped else first_divergence(a, b)
    seen = {"identical": where is None, "first_divergence": where, "compared": n, "cancelled": stopped}
    wrong = [f"'{k}' {p[k]!r} (the runs' tokens say {v!r})" for k, v in seen.items() if p[k] != v]
    if wrong:
        raise DFlashError(f"{path}: the parity record does not match its runs: {', '.join(wrong)}; the trace is "
                          "damaged.")


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records) of the run a trace shows: its only run, or a parity check's last (its DFlash
    run, or its AR run when Stop ended the check there)."""
    run = read_runs(path).shown
    return run.header, run.records


def process_name(header: dict[str, Any]) -> str:
    """What Perfetto calls the run: its mode and target, e.g. "DFlash run: demo-target"."""
    mode = {"dflash": "DFlash", "ar": "AR"}.get(header.get("mode") or "dflash", str(header.get("mode")))
    target = header.get("target") or (header.get("model") or {}).get("target")
    return f"{mode} run: {Path(str(target)).name}" if target else f"{mode} run"


def chrome_events(header: dict[str, Any], records: list[dict[str, Any]], pid: int = 1) -> Iterator[dict[str, Any]]:
    """One run as one Perfetto process: its prefill, then draft, verify and rollback spans per round,
    tau and tok/s counters. Records time decoding from its start; the prefill (most of a long
    prompt's run) goes before it, from the summary (a trace cut short has none: decoding starts at 0)."""
    tracks = {"prefill": 0, "draft": 1, "verify": 2, "rollback": 3, "tokens": 4}
    yield {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process_name(header)}}
    for name, tid in tracks.items():
        yield {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
    summary = next((r for r in records if r["type"] == "summary"), {})
    shift = float(summary.get("prefill_s") or 0.0) * 1e6
    if shift:
        yield {"ph": "X", "pid": pid, "tid": tracks["prefill"], "name": "prefill", "ts": 0.0, "dur": shift,
               "args": {"prompt_tokens": summary.get("prompt_tokens"), "reused_tokens": summary.get("reused_tokens", 0)}}
    for r in records:
        if r["type"] == "round":
            end = shift + r["t"] * 1e6
            spans = [("rollback", r["rollback_ms"]), ("verify", r["verify_ms"]), ("draft", r["draft_ms"])]
            for name, ms in spans:  # laid out backwards from the round's end
                start = end - ms * 1000.0
                yield {
                    "ph": "X", "pid": pid, "tid": tracks[name], "name": name, "ts": start, "dur": ms * 1000.0,
                    "args": {"round": r["index"], "accepted": r["accepted"], "drafted": len(r["drafted"])},
                }
                end = start
            yield {"ph": "C", "pid": pid, "name": "acceptance length", "ts": shift + r["t"] * 1e6,
                   "args": {"tau": r["accepted"] + 1}}
    yield from _tok_s_counters(records, pid, shift)


def _tok_s_counters(records: list[dict[str, Any]], pid: int, shift: float) -> Iterator[dict[str, Any]]:
    count = 0
    for r in records:
        if r["type"] == "text" and r["token_ids"]:
            count += len(r["token_ids"])
            if r["t"] > 0:
                yield {"ph": "C", "pid": pid, "name": "tok/s", "ts": shift + r["t"] * 1e6,
                       "args": {"tok_s": round(count / r["t"], 3)}}


def export_chrome(trace_path: str | Path, out_path: str | Path, note: Callable[[str], None] = lambda _: None) -> int:
    """Write Chrome trace JSON (opens in Perfetto); return the number of events. `note` hears of a run
    the trace holds no summary of (cut short: its timeline has no prefill, and may miss its end)."""
    out_path = check_output(out_path, "the Chrome trace", inputs=(trace_path,))
    runs = read_runs(trace_path).runs
    events = [e for pid, run in enumerate(runs, 1)  # a parity check: AR, then DFlash
              for e in chrome_events(run.header, run.records, pid)]
    for run in runs:
        if not any(r["type"] == "summary" for r in run.records):
            note(f"the trace ends before its {run.header.get('mode') or 'dflash'} run's summary (a stopped or crashed "
                 "run, or a file cut short): the timeline has the rounds it holds, without the prefill")
    write_atomic(out_path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}), "the Chrome trace")
    return len(events)
