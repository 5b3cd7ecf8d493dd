"""AR and DFlash outputs side by side: differences marked, first divergence, margin and speedup."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from app.jobs import ParityDone
from app.output_view import OutputView
from app.run_record import RunRecord

NEAR_TIE = 1e-3  # as the CLI: a flip below this AR logit margin is floating point


def differing_tokens(a: list[int], b: list[int]) -> list[int]:
    """Indices where the two outputs differ, including where one is longer."""
    n = max(len(a), len(b))
    return [i for i in range(n) if i >= len(a) or i >= len(b) or a[i] != b[i]]


TOK_S = "tok/\u2060s"  # a word joiner: Qt may otherwise wrap the line after the slash


def headline(result: ParityDone) -> str:
    speed = (f"speedup ×{result.speedup:.2f} (AR {result.ar_tok_s:.1f} {TOK_S}, "
             f"DFlash {result.dflash_tok_s:.1f} {TOK_S})")
    if result.round_in_ar_steps and result.mean_acceptance_length:
        speed += (f". A round cost {result.round_in_ar_steps:.2f} AR steps, so DFlash breaks even at "
                  f"tau {result.round_in_ar_steps:.2f}; this run's tau: {result.mean_acceptance_length:.2f}")
    if result.cancelled:
        return f"Stopped before the end; outputs compared so far. {speed}"
    if result.identical:
        return f"Identical: DFlash reproduced AR token for token. {speed}"
    where = f"Outputs differ from token {result.first_divergence}"
    if result.margin_at_divergence is None:
        return f"{where} (one output is longer). {speed}"
    kind = "a near-tie flip (floating point)" if result.margin_at_divergence < NEAR_TIE else "a real divergence"
    return f"{where}; AR logit margin there {result.margin_at_divergence:.3g}: {kind}. {speed}"


class ParityView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.result: Optional[ParityDone] = None
        self.headline = QLabel("Run in “Both” mode to compare AR and DFlash on the same prompt.")
        self.headline.setObjectName("parityHeadline")
        self.headline.setWordWrap(True)
        self.ar = OutputView(self, "parityText")
        self.dflash = OutputView(self, "parityText")
        grid = QGridLayout(self)
        grid.addWidget(self.headline, 0, 0, 1, 2)
        for col, (name, view) in enumerate((("AR", self.ar), ("DFlash", self.dflash))):
            label = QLabel(name)
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            grid.addWidget(label, 1, col)
            grid.addWidget(view, 2, col)
        self.differences: list[int] = []

    def clear(self) -> None:
        self.result = None
        self.differences = []
        self.ar.set_run(None)
        self.dflash.set_run(None)
        self.headline.setText("Run in “Both” mode to compare AR and DFlash on the same prompt.")

    def show_runs(self, ar: Optional[RunRecord], dflash: Optional[RunRecord]) -> None:
        """Stream both texts as they arrive (called on refresh)."""
        for view, run in ((self.ar, ar), (self.dflash, dflash)):
            if view.run is not run:
                view.set_run(run)
            else:
                view.refresh()

    def show_result(self, result: ParityDone, ar: RunRecord, dflash: RunRecord) -> None:
        self.result = result
        self.show_runs(ar, dflash)
        self.differences = differing_tokens(ar.token_ids(), dflash.token_ids())
        first = result.first_divergence
        self.ar.mark_tokens(self.differences, first)
        self.dflash.mark_tokens(self.differences, first)
        self.headline.setText(headline(result))
