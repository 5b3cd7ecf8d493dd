"""Traces: JSONL (schema dflash-trace/1), written and flushed per round, and Chrome trace export."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Iterator, Optional

from engine import json_text
from engine.errors import DFlashError
from engine.safe_write import check_output, replace_with, write_atomic
from engine.tools.textfiles import read_text
from engine.decode.events import (
    EVENT_TYPES, Event, RoundEvent, StartEvent, SummaryEvent, TextEvent, from_dict, to_dict,
)

SCHEMA = "dflash-trace/1"


def environment() -> dict[str, Any]:
    import mlx.core as mx
    import mlx_lm

    from engine import __version__
    from engine.runtime import blas
    from engine.runtime.streams import device_kind

    return {
        "app_version": __version__,
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "device": f"{device_kind()} ({platform.system()} {platform.machine()}, blas: {blas.status})",
    }


def _read_config(folder: Optional[str]) -> Optional[dict]:
    if not folder:
        return None
    try:
        return json_text.loads((Path(folder) / "config.json").read_bytes())
    except (OSError, ValueError):
        return None


def header_record(start: StartEvent, prompt: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The trace's first line. `prompt`: {"text": ..., "format": "chat" | "raw" | "auto"} where the
    caller knows them, so an opened trace can show and re-run the prompt."""
    model = start.model
    return {
        "type": "header",
        "schema": SCHEMA,
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


class TraceWriter:
    """Writes one JSON line per record to FILE.<pid>.partial beside FILE, flushed as it goes (a
    crash leaves a valid prefix there); `close(complete=True)` renames it to FILE. An earlier FILE
    is never touched until the new trace is whole."""

    def __init__(self, path: str | Path, prompt: Optional[dict[str, Any]] = None,
                 inputs: tuple[Optional[str | Path], ...] = ()):
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
            self._write(header_record(event, self.prompt))
        elif isinstance(event, (RoundEvent, TextEvent, SummaryEvent)):
            self._write(to_dict(event))

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


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records). A torn last line (crash mid-write) is dropped; anything else is an error."""
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
    if not records or records[0].get("type") != "header" or records[0].get("schema") != SCHEMA:
        raise DFlashError(f"{path}: no '{SCHEMA}' header on the first line; this is not a dflash trace.")
    header = records[0]
    for key, kind in (("mode", str), ("settings", dict), ("prompt_ids", list), ("model", dict), ("prompt", dict),
                      ("device", str), ("target", str), ("drafter", str)):
        if header.get(key) is not None and not isinstance(header[key], kind):
            raise DFlashError(f"{path}: line 1: the header's '{key}' is not a {kind.__name__}; the trace is damaged.")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in header.get("prompt_ids") or []):
        raise DFlashError(f"{path}: line 1: the header's 'prompt_ids' are not all token ids; the trace is damaged.")
    for n, record in enumerate(records[1:], 2):  # every record a reader will use, checked once here
        if record.get("type") in EVENT_TYPES and record.get("type") != "start":
            try:
                from_dict(record)
            except ValueError as exc:
                raise DFlashError(f"{path}: line {n}: {exc}; the trace is damaged.") from None
    return records[0], records[1:]


def process_name(header: dict[str, Any]) -> str:
    """What Perfetto calls the run: its mode and target, e.g. "DFlash run: demo-target"."""
    mode = {"dflash": "DFlash", "ar": "AR"}.get(header.get("mode") or "dflash", str(header.get("mode")))
    target = header.get("target") or (header.get("model") or {}).get("target")
    return f"{mode} run: {Path(str(target)).name}" if target else f"{mode} run"


def chrome_events(header: dict[str, Any], records: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    pid = 1
    tracks = {"draft": 1, "verify": 2, "rollback": 3, "tokens": 4}
    yield {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process_name(header)}}
    for name, tid in tracks.items():
        yield {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
    for r in records:
        if r["type"] == "round":
            end = r["t"] * 1e6
            spans = [("rollback", r["rollback_ms"]), ("verify", r["verify_ms"]), ("draft", r["draft_ms"])]
            for name, ms in spans:  # laid out backwards from the round's end
                start = end - ms * 1000.0
                yield {
                    "ph": "X", "pid": pid, "tid": tracks[name], "name": name, "ts": start, "dur": ms * 1000.0,
                    "args": {"round": r["index"], "accepted": r["accepted"], "drafted": len(r["drafted"])},
                }
                end = start
            yield {"ph": "C", "pid": pid, "name": "acceptance length", "ts": r["t"] * 1e6,
                   "args": {"tau": r["accepted"] + 1}}
    yield from _tok_s_counters(records, pid)


def _tok_s_counters(records: list[dict[str, Any]], pid: int) -> Iterator[dict[str, Any]]:
    count = 0
    for r in records:
        if r["type"] == "text" and r["token_ids"]:
            count += len(r["token_ids"])
            if r["t"] > 0:
                yield {"ph": "C", "pid": pid, "name": "tok/s", "ts": r["t"] * 1e6,
                       "args": {"tok_s": round(count / r["t"], 3)}}


def export_chrome(trace_path: str | Path, out_path: str | Path) -> int:
    """Write Chrome trace JSON (opens in Perfetto); return the number of events."""
    out_path = check_output(out_path, "the Chrome trace", inputs=(trace_path,))
    header, records = read_trace(trace_path)
    events = list(chrome_events(header, records))
    write_atomic(out_path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}), "the Chrome trace")
    return len(events)
