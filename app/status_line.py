"""The status bar's figures for the runs on show: tok/s (AR vs DFlash in Both mode, vs the chosen
method in a race), tau, rounds, tokens, device and peak memory."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QStatusBar

from app.run_record import RunRecord
from app.theme import METHOD_LABEL

DEVICE_WIDTH = 180  # px: the whole line is in its tooltip

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


class StatusLine:
    def __init__(self, bar: QStatusBar):
        self.labels: dict[str, QLabel] = {}
        for key in NAMES:
            label = QLabel(f"{key}: –")
            bar.addPermanentWidget(label)
            self.labels[key] = label

    def show_device(self, device: str) -> None:
        """The device line, cut with an ellipsis to a width that leaves the bar's messages room on a
        laptop screen (a trace's device line names the OS and BLAS; clipped, "blas: openblas" read
        as a whole line); the whole line in its tooltip."""
        label = self.labels["device"]
        line = f"device: {device}"
        label.setText(label.fontMetrics().elidedText(line, Qt.ElideRight, DEVICE_WIDTH))
        label.setToolTip(line)
        label.setMaximumWidth(DEVICE_WIDTH)

    def show_runs(self, runs: dict[str, RunRecord], current: Optional[RunRecord],
                  rounds_run: Optional[RunRecord]) -> None:
        labels = self.labels
        run = rounds_run or current
        if run is None:
            for key, name in NAMES.items():
                if key != "device":
                    labels[key].setText(f"{name}: –")
            return
        shown = current or run
        # Beside AR: the run whose rounds are shown (a race's chosen method), else DFlash (Both mode).
        ar = runs.get("ar")
        df = rounds_run if rounds_run is not None and rounds_run is not ar else runs.get("dflash")
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
        labels["peak"].setText(f"peak: {peak:.0f} MB" if peak is not None else "peak: –")
