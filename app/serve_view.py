"""The Serve tab: serve the loaded pair over HTTP (engine/serve/) and watch every request it answers.

Start serves the pair the window has loaded on a port of this machine (127.0.0.1); Copy puts the
base URL on the clipboard. While it serves, the window's own runs queue on the server's decode
thread with the clients' (the worker hands them to it: app/worker.py's `serving`), and loading
another pair is refused until Stop. Each request is a row: time, endpoint, prompt tokens (cached),
tokens generated, tok/s, tau, status. Selecting one shows its rounds, output, plots and Why in the
window's views, as an opened trace is shown (and File > Export exports it as a trace); a running
one is shown again as it streams. Check parity runs a finished one's prompt and settings again as
Both (AR, then DFlash), as the Parity tab shows any run. The view knows no threads: the server's watcher puts events on a
queue, and a timer here drains it.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any, Optional

from PySide6.QtCore import QEvent, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QSpinBox, QTableWidget,
    QTableWidgetItem, QVBoxLayout, QWidget,
)

from engine.decode.events import RoundEvent, StartEvent, SummaryEvent, TextEvent
from engine.decode.settings import AUTO_BY_DEFAULT, LOOKUP_BY_DEFAULT, GenerationSettings
from engine.errors import DFlashError
from engine.serve.defaults import DEFAULT_PORT
from app.run_record import RunRecord

COLUMNS = ("time", "endpoint", "prompt (cached)", "generated", "tok/s", "τ", "status")
DRAIN_MS = 200
KEPT_REQUESTS = 200  # rows (and their events) kept; the oldest go first


class Served:
    """One request as the view keeps it: its run record (from its StartEvent on) and its state."""

    def __init__(self, request_id: int, endpoint: str):
        self.id, self.endpoint, self.started = request_id, endpoint, time.strftime("%H:%M:%S")
        self.record: Optional[RunRecord] = None
        self.status = "waiting"

    def cells(self) -> tuple[str, ...]:
        r = self.record
        s = r.summary if r is not None else None
        prompt = f"{s.prompt_tokens} ({s.reused_tokens})" if s else (str(len(r.start.prompt_ids)) if r else "")
        generated = str(s.num_generated if s else len(r.token_ids())) if r else ""
        speed = f"{s.tok_per_s:.1f}" if s and s.timed else ""
        tau = f"{s.mean_acceptance_length:.2f}" if s and s.mean_acceptance_length else ""
        return self.started, self.endpoint, prompt, generated, speed, tau, self.status


class ServeView(QWidget):
    def __init__(self, window):
        super().__init__()
        self.w = window
        self.serving = None  # engine.serve.background.Serving while it serves
        self.requests: dict[int, Served] = {}
        self.shown: Optional[int] = None  # the request whose run the window's views show
        self._inbox: "queue.SimpleQueue[tuple[int, str, Any]]" = queue.SimpleQueue()
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setValue(DEFAULT_PORT)
        self.port.setToolTip("the port to listen on, on this machine (127.0.0.1); 0 picks a free one")
        self.key = QLineEdit()
        self.key.setPlaceholderText("API key (optional)")
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.start_button, self.stop_button = QPushButton("Start serving"), QPushButton("Stop")
        self.url = QLineEdit()
        self.url.setReadOnly(True)
        self.url.setPlaceholderText("not serving")
        self.copy_button = QPushButton("Copy URL")
        self.parity_button = QPushButton("Check parity")
        self.parity_button.setToolTip("run the selected request's prompt and settings again here as Both: AR, then "
                                      "DFlash, compared token for token (the Parity tab)")
        self.state = QLabel("Serve the loaded pair to OpenAI- and Anthropic-compatible clients.")
        self.state.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        bar = QHBoxLayout()
        for widget in (QLabel("Port"), self.port, self.key, self.start_button, self.stop_button, self.url,
                       self.copy_button, self.parity_button):
            bar.addWidget(widget)
        layout = QVBoxLayout(self)
        layout.addLayout(bar)
        layout.addWidget(self.state)
        layout.addWidget(self.table, 1)
        self.start_button.clicked.connect(self.start)
        self.stop_button.clicked.connect(self.stop)
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.url.text()))
        self.table.itemSelectionChanged.connect(self._selected)
        self.parity_button.clicked.connect(self.check_parity)
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.drain)
        self._buttons()

    def _buttons(self) -> None:
        on = self.serving is not None
        self.start_button.setEnabled(not on)
        self.stop_button.setEnabled(on)
        self.port.setEnabled(not on)
        self.key.setEnabled(not on)
        self.copy_button.setEnabled(on)
        served = self.requests.get(self.shown) if self.shown is not None else None
        self.parity_button.setEnabled(served is not None and served.record is not None
                                      and served.record.summary is not None)

    def start(self) -> bool:
        """Serve the loaded pair; False (with the reason said) when it cannot."""
        from engine.serve.background import Serving, bind

        worker = self.w.controller.host.worker
        if self.w.busy or worker.pair is None:
            self.w.show_error("Nothing to serve", "load a pair first (and wait for the run to end): the server "
                              "serves the pair the window has loaded.")
            return False
        pair = worker.pair  # a reference only: its arrays are used on the server's decode thread
        base = GenerationSettings(auto=AUTO_BY_DEFAULT and pair.drafter is not None, lookup=LOOKUP_BY_DEFAULT,
                                  mode="dflash" if pair.drafter is not None else "ar")
        try:
            self.serving = Serving(pair, bind("127.0.0.1", self.port.value()), base, api_key=self.key.text() or None,
                                   watch=lambda rid, endpoint, item: self._inbox.put((rid, endpoint, item)))
        except DFlashError as exc:
            self.w.show_error("Could not serve", str(exc))
            return False
        worker.serving = self.serving.engine  # the window's runs queue with the clients' from now on
        self.url.setText(self.serving.url + "/v1")
        self.state.setText(f"Serving {pair.target_path.name} at {self.serving.url}/v1 (OpenAI) and {self.serving.url} "
                           "(Anthropic). The window's runs queue with the clients'; loading another pair waits "
                           "for Stop.")
        self.timer.start(DRAIN_MS)
        self._buttons()
        return True

    def stop(self) -> None:
        if self.serving is None:
            return
        serving, self.serving = self.serving, None
        serving.stop()  # the running request ends at its round; waiting ones are refused
        self.w.controller.host.worker.serving = None
        self.drain()
        self.timer.stop()
        self.url.clear()
        self.state.setText("Stopped serving.")
        self._buttons()

    def drain(self) -> None:
        """Take the server's events: new rows, records grown, the shown request re-shown as it streams."""
        changed = set()
        while True:
            try:
                rid, endpoint, item = self._inbox.get_nowait()
            except queue.Empty:
                break
            served = self.requests.get(rid) or self._add(rid, endpoint)
            self._feed(served, item)
            changed.add(rid)
        for rid in changed:
            self._show_row(rid)
        if self.shown in changed:
            self._show(self.requests[self.shown])
            self._buttons()

    def _add(self, rid: int, endpoint: str) -> Served:
        served = self.requests[rid] = Served(rid, endpoint)
        self.table.insertRow(0)
        while self.table.rowCount() > KEPT_REQUESTS:
            self.table.removeRow(self.table.rowCount() - 1)
            self.requests.pop(min(self.requests))
        return served

    def _feed(self, served: Served, item: Any) -> None:
        if isinstance(item, StartEvent):
            from engine.tools.trace import header_record

            text = self.w.controller.host.worker.pair.tokenizer.decode(item.prompt_ids)
            loaded = self.w.controller.loaded  # its token table: the rounds view shows tokens as text
            served.record = RunRecord(item, header_record(item, {"text": text, "format": "raw"}),
                                      loaded.token_table if loaded is not None else None)
            served.status = "running"
        elif isinstance(item, BaseException):
            served.status = "not run" if served.record is None else f"failed: {item}"
        elif served.record is not None and isinstance(item, (RoundEvent, TextEvent, SummaryEvent)):
            served.record.add(item)
            if isinstance(item, SummaryEvent):
                served.status = item.stop_reason

    def _show_row(self, rid: int) -> None:
        row = sorted(self.requests, reverse=True).index(rid)
        for col, text in enumerate(self.requests[rid].cells()):
            self.table.setItem(row, col, QTableWidgetItem(text))

    def _selected(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return
        rid = sorted(self.requests, reverse=True)[rows[0].row()]
        self.shown = rid
        self._show(self.requests[rid])
        self._buttons()

    def check_parity(self) -> None:
        """The selected request's prompt and settings in the prompt panel, run as Both (AR beside DFlash)."""
        served = self.requests.get(self.shown) if self.shown is not None else None
        if served is None or served.record is None or self.w.busy:
            return
        self.w.prompt.apply_trace_header(served.record.header, served.record.table)
        self.w.prompt.set_mode("both")
        self.w.start_run()

    def _show(self, served: Served) -> None:
        if served.record is not None and not self.w.busy:
            self.w.controller.show_replay(served.record, Path(f"served request {served.id}"))


    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt API)
        if event.type() == QEvent.Type.Close:  # the window closes: stop serving before it lets go of its pair
            self.stop()
        return False


def add_serve_tab(window) -> ServeView:
    """The Serve tab, beside the window's other tabs."""
    view = ServeView(window)
    window.center_tabs.addTab(view, "Serve")
    window.installEventFilter(view)
    window.serve_view = view
    return view
