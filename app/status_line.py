"""The status bar's figures for the runs on show: tok/s (AR vs DFlash in Both mode, vs the chosen
method in a race), tau, rounds, tokens, device and peak memory."""

from __future__ import annotations

import re
import time
from typing import Optional

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QLabel, QStatusBar

from app.run_record import RunRecord
from app.theme import METHOD_LABEL

DEVICE_WIDTH = 180  # px: the whole line is in its tooltip
FIGURE_SPACING = 6  # px the bar's layout puts beside each figure

LIBRARY_PATH = re.compile(r" \(/[^()]*\)")  # " (/path/to/libopenblas.so.0)" in a device line
NAMES = {"tok/s": "tok/s", "tau": "τ", "rounds": "rounds", "tokens": "tokens", "device": "device", "peak": "peak"}


def trace_device(header: dict) -> Optional[str]:
    """The device line of a trace header, with the ranks of a sharded run (mlx.launch) when it had them."""
    device = header.get("device")
    if not isinstance(device, str):
        return None
    model = header.get("model")
    dist = model.get("distributed") if isinstance(model, dict) else None
    if isinstance(dist, dict):
        device += (f" · {dist.get('ranks')} ranks ({dist.get('backend')}, {dist.get('sharding')} parallel, "
                   f"{dist.get('collective_ms', 0):.2f} ms per collective)")
    return device


class ElidedLabel(QLabel):
    """A line cut with an ellipsis to the width the bar gives it (at most DEVICE_WIDTH), the whole
    line in its tooltip: the bar squeezes its permanent widgets below their hints on a laptop
    screen, and a clipped "device: cpu (blas: openblas" read as a whole line."""

    def __init__(self, text: str):
        super().__init__(text)
        self.line = text
        self.setMaximumWidth(DEVICE_WIDTH)

    def set_line(self, line: str, shown: Optional[str] = None) -> None:
        """`line` in the tooltip, `shown` (by default the line) cut to the label."""
        self.line = shown or line
        self.setToolTip(line)
        self._elide()
        self.updateGeometry()

    def sizeHint(self) -> QSize:  # the whole line's width, not the cut text's: no shrinking feedback
        hint = super().sizeHint()
        return QSize(min(self._room_for(self.line), DEVICE_WIDTH), hint.height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self._room_for("device: …"), super().minimumSizeHint().height())

    def _room_for(self, text: str) -> int:
        """The width that shows `text` whole inside the label's margins and frame (see _elide)."""
        m = self.contentsMargins()
        # + 1: elidedText cuts a text exactly as wide as the room it is given
        return self.fontMetrics().horizontalAdvance(text) + 5 + m.left() + m.right() + 2 * self.frameWidth()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        # the room inside the margins the bar's style gives it: the whole width put the "…" outside
        self.setText(self.fontMetrics().elidedText(self.line, Qt.ElideRight, max(self.contentsRect().width() - 4, 0)))


class MessageBar(QStatusBar):
    """A status bar whose message, where the figures beside it leave too little room, ends in "…" and
    reads whole in the tooltip (it was cut mid-word at 1280x800: "…18/27, abou", "from the AR ru")."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.whole = ""
        self.until: Optional[float] = None  # when a message shown for a while goes (time.monotonic())
        self.messageChanged.connect(self._changed)

    def showMessage(self, message: str, timeout: int = 0) -> None:  # noqa: N802 (Qt API)
        self.whole = message
        self.until = time.monotonic() + timeout / 1000 if timeout else None
        self.setToolTip(message)
        super().showMessage(self._fitted(message), timeout)

    def currentMessage(self) -> str:  # noqa: N802
        return self.whole if super().currentMessage() else ""

    def _changed(self, shown: str) -> None:
        if not shown:  # its time ran out, or cleared
            self.whole = ""
            self.setToolTip("")

    def _fitted(self, message: str) -> str:
        """`message` cut to the room the figures leave it (their texts' widths now: the layout is done later)."""
        widgets = [w for w in self.findChildren(QLabel) if w.isVisible() and w.parentWidget() is self]
        room = self.width() - sum(w.sizeHint().width() + FIGURE_SPACING for w in widgets) - 28
        return self.fontMetrics().elidedText(message, Qt.ElideRight, max(room, 40))

    def refit(self) -> None:
        """Cut the message on show again: the bar or the figures beside it changed width."""
        if self.whole and super().currentMessage():
            left = 0 if self.until is None else max(int((self.until - time.monotonic()) * 1000), 1)
            super().showMessage(self._fitted(self.whole), left)

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self.refit()


class StatusLine:
    def __init__(self, bar: QStatusBar):
        self.bar = bar
        self.labels: dict[str, QLabel] = {}
        for key in NAMES:
            label = ElidedLabel(f"{key}: –") if key == "device" else QLabel(f"{key}: –")
            bar.addPermanentWidget(label)
            self.labels[key] = label

    def show_device(self, device: str) -> None:
        """The device line, cut to the room the bar leaves it (see ElidedLabel), without the BLAS library's
        path (in the tooltip)."""
        self.labels["device"].set_line(f"device: {device}", f"device: {LIBRARY_PATH.sub('', device)}")

    def show_runs(self, runs: dict[str, RunRecord], current: Optional[RunRecord],
                  rounds_run: Optional[RunRecord]) -> None:
        self._figures(runs, current, rounds_run)
        if isinstance(self.bar, MessageBar):
            self.bar.refit()  # the figures' new widths leave the message more room, or less

    def _figures(self, runs: dict[str, RunRecord], current: Optional[RunRecord],
                 rounds_run: Optional[RunRecord]) -> None:
        labels = self.labels
        run = rounds_run or current
        if run is None:
            for key, name in NAMES.items():
                if key != "device":
                    labels[key].setText(f"{name}: –")
            return
        shown = current or run
        if not shown.tokens and runs.get("ar") is not None and runs["ar"].tokens and shown is not runs["ar"]:
            shown = runs["ar"]  # Both mode's DFlash half stopped before its first token: AR's figures
        # Beside AR: the run whose rounds are shown (a race's chosen method), else DFlash (Both mode); a
        # race's AR row chosen: AR's alone
        ar = runs.get("ar")
        df = rounds_run if rounds_run is not None and rounds_run is not ar else \
            runs.get("dflash") if current is not ar else None
        name = next((label for label, r in runs.items() if r is df), "dflash")
        if ar is not None and df is not None and ar.tok_per_s and df.tok_per_s:
            labels["tok/s"].setText(f"tok/s: AR {ar.tok_per_s:.1f} · {METHOD_LABEL.get(name, name)} "
                                    f"{df.tok_per_s:.1f} (×{df.tok_per_s / ar.tok_per_s:.2f})")
        else:
            tps = shown.tok_per_s
            labels["tok/s"].setText(f"{shown.mode} tok/s: {tps:.1f}" if tps is not None else "tok/s: –")
        tau = run.tau
        labels["tau"].setText(f"τ: {tau:.2f}" if tau is not None else "τ: –")
        stats = run.stats  # as the engine counts them: auto's plain steps are no rounds (τ leaves them out)
        plain = f" (+{stats.plain_steps} plain)" if stats.plain_steps else ""
        labels["rounds"].setText(f"rounds: {stats.rounds}{plain}")
        labels["tokens"].setText(f"tokens: {len(shown.tokens)}")
        peak = shown.summary.peak_memory_mb if shown.summary else None
        labels["peak"].setText(f"peak: {peak:.0f} MB" if peak else "peak: –")  # 0: nothing measured
