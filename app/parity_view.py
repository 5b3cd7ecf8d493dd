"""AR and DFlash outputs side by side: differences marked, first divergence, margin and speedup."""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QScrollArea, QWidget

from app import theme
from app.layout_fit import readable, scrolled
from app.jobs import ParityDone
from app.output_view import OutputView
from app.run_record import RunRecord
from engine.decode.events import NOT_TIMED
from engine.tools.parity import IDENTICAL, NEAR_TIE, SAMPLES, parity_verdict


def differing_tokens(a: list[int], b: list[int]) -> list[int]:
    """Indices where the two outputs differ, including where one is longer."""
    n = max(len(a), len(b))
    return [i for i in range(n) if i >= len(a) or i >= len(b) or a[i] != b[i]]


TOK_S = "tok/\u2060s"  # a word joiner: Qt may otherwise wrap the line after the slash


def headline(result: ParityDone, temperature: float, dtype: str) -> str:
    """The engine's verdict (as `parity` prints it) at the runs' temperature and logits dtype, then speed.
    A stopped comparison says how far it got and gives no speed: a run cut short has none to compare."""
    if result.ended_at_once and not result.cancelled:  # one token each over no decoding time: no rate
        return ("The target wrote EOS as its first token in both runs, so there was nothing to decode and no "
                "speed to compare: write on, or end the prompt mid-line.")
    if temperature > 0 and (result.compared or not result.cancelled):
        return samples_headline(result, temperature)
    if result.cancelled:
        if not result.dflash_ran:
            return "Stopped during the AR run: DFlash did not start, so there is nothing to compare."
        if not result.compared:
            return "Stopped before DFlash wrote its first token: there is nothing to compare."
        if result.identical:
            return (f"Stopped before the end: identical over the {result.compared:,} tokens both runs wrote "
                    "(the rest was not compared).")
        verdict = parity_verdict(False, result.first_divergence, result.margin_at_divergence, temperature, dtype).text
        return f"Stopped before the end, but within the {result.compared:,} tokens both runs wrote: {verdict}."
    speed = (f"speedup ×{result.speedup:.2f} (AR {result.ar_tok_s:.1f} {TOK_S}, "
             f"DFlash {result.dflash_tok_s:.1f} {TOK_S})" if result.timed else f"no speed: {NOT_TIMED}")
    if result.timed and result.round_in_ar_steps and result.mean_acceptance_length:
        speed += (f". A round cost {result.round_in_ar_steps:.2f} AR steps, so DFlash breaks even at "
                  f"tau {result.round_in_ar_steps:.2f}; this run's tau: {result.mean_acceptance_length:.2f}")
    verdict = parity_verdict(result.identical, result.first_divergence, result.margin_at_divergence,
                             temperature, dtype).text
    return f"{verdict[0].upper()}{verdict[1:]}. {speed[0].upper()}{speed[1:]}"


def samples_headline(result: ParityDone, temperature: float) -> str:
    """At T > 0 the two runs are two samples: one short line, no logit margin (it decides nothing
    there), the speed where the runs finished."""
    seen = ("identical" if result.identical else f"they differ from token {result.first_divergence}, as samples may")
    head = (f"Two samples at temperature {temperature:g}: {seen}. DFlash is lossless in distribution, "
            "not sample for sample")
    if result.cancelled:
        return f"{head}. Stopped before the end ({result.compared:,} tokens compared)."
    if not result.timed:
        return f"{head}. No speed: {NOT_TIMED}."
    return (f"{head}. Speedup ×{result.speedup:.2f} (AR {result.ar_tok_s:.1f} {TOK_S}, "
            f"DFlash {result.dflash_tok_s:.1f} {TOK_S}).")


def unfinished_headline(ar: RunRecord, dflash: Optional[RunRecord], differences: list[int]) -> str:
    """An opened check that did not finish (no verdict in its file): what its runs' tokens show, without
    AR's logit margin (that needs the model)."""
    if dflash is None:
        return "This check did not finish: its file holds the AR run only, so there is nothing to compare."
    n = min(len(ar.tokens), len(dflash.tokens))
    seen = (f"identical over the {n:,} tokens both runs wrote" if not differences else
            f"outputs differ from token {differences[0]} (AR's logit margin there needs the model: run it again)")
    return f"This check did not finish, so its file has no verdict: {seen}."


def verdict_kind(result: Optional[ParityDone], ar: RunRecord) -> Optional[str]:
    """The comparison's verdict kind (engine/tools/parity.py) at its runs' temperature and logits dtype;
    None when Stop left nothing to compare or a check did not finish."""
    if result is None or (result.cancelled and not result.compared):
        return None
    temperature, dtype = run_conditions(ar)
    return parity_verdict(result.identical, result.first_divergence, result.margin_at_divergence,
                          temperature, dtype).kind


def parity_mark(result: Optional[ParityDone], ar: RunRecord) -> str:
    """The Parity tab's mark: ✓ identical, ✗ a divergence at a clear margin, ≈ a near-tie flip,
    and ~ at T > 0, where two samples are compared only in distribution; – when Stop left nothing
    to compare or a check did not finish (a stopped comparison is marked by what the tokens both
    runs wrote show)."""
    kind = verdict_kind(result, ar)
    return "–" if kind is None else {IDENTICAL: "✓", NEAR_TIE: "≈", SAMPLES: "~"}.get(kind, "✗")


def diff_colour(result: Optional[ParityDone], ar: RunRecord) -> str:
    """How the differences are marked: red for a real divergence (or one not judged), amber for a
    near-tie flip, muted between two samples (T > 0), where a difference is no error."""
    if run_conditions(ar)[0] > 0:
        return theme.DIFF_SAMPLE
    return theme.DIFF_NEAR_TIE if verdict_kind(result, ar) == NEAR_TIE else theme.DIFF_MARK


def run_conditions(run: RunRecord) -> tuple[float, str]:
    """(temperature, logits dtype) of a run, from its start event (live or from a trace)."""
    sampling = run.start.settings.get("sampling") or {}
    return float(sampling.get("temperature", 0.0)), str(run.start.model.get("dtype", "float32"))


class ParityView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.result: Optional[ParityDone] = None
        self.headline = QLabel("Run in “Both” mode to compare AR and DFlash on the same prompt.")
        self.headline.setObjectName("parityHeadline")
        self.headline.setWordWrap(True)
        self.ar = OutputView(self, "parityText")
        self.dflash = OutputView(self, "parityText")
        for view in (self.ar, self.dflash):  # a few lines at least: the page scrolls below that
            readable(view, view.fontMetrics().lineSpacing() * 4 + 2 * view.frameWidth() + 8)
        grid = QGridLayout(scrolled(self))
        grid.addWidget(self.headline, 0, 0, 1, 2)
        self.labels: dict[str, QLabel] = {}
        for col, (name, view) in enumerate((("AR", self.ar), ("DFlash", self.dflash))):
            label = self.labels[name] = QLabel(name)
            label.setAlignment(Qt.AlignmentFlag.AlignCenter)
            grid.addWidget(label, 1, col)
            grid.addWidget(view, 2, col)
        grid.setRowStretch(2, 1)  # the texts take the height, the headline only its lines
        self.differences: list[int] = []

    def clear(self) -> None:
        self.result = None
        self.differences = []
        self.ar.set_run(None)
        self.dflash.set_run(None)
        self.headline.setText("Run in “Both” mode to compare AR and DFlash on the same prompt.")
        for name, label in self.labels.items():
            label.setText(name)

    def show_runs(self, ar: Optional[RunRecord], dflash: Optional[RunRecord]) -> None:
        """Stream both texts as they arrive (called on refresh)."""
        for name, view, run in (("AR", self.ar, ar), ("DFlash", self.dflash, dflash)):
            if view.run is not run:
                view.set_run(run)
            else:
                view.refresh()
            n = len(run.tokens) if run is not None else None
            self.labels[name].setText(name if n is None else f"{name} · {n:,} token{'s' if n != 1 else ''}")

    def show_result(self, result: Optional[ParityDone], ar: RunRecord, dflash: Optional[RunRecord]) -> None:
        """A comparison's verdict, or (None: an opened check that did not finish) what its tokens show."""
        self.result = result
        self.show_runs(ar, dflash)
        a, b = ar.token_ids(), (dflash.token_ids() if dflash is not None else [])
        if result is None or result.cancelled:  # a stopped run's missing tail is no difference
            n = min(len(a), len(b))
            a, b = a[:n], b[:n]
        self.differences = differing_tokens(a, b)
        first = result.first_divergence if result is not None else (self.differences or [None])[0]
        colour = diff_colour(result, ar)
        for view in (self.ar, self.dflash):
            view.mark_tokens(self.differences, first, colour)
            if first is not None:  # both sides at the first difference (each scrolls alone after)
                view.scroll_to_token(first)
        self.headline.setText(headline(result, *run_conditions(ar)) if result is not None
                              else unfinished_headline(ar, dflash, self.differences))
        self.findChild(QScrollArea).verticalScrollBar().setValue(0)  # a short tab: the verdict first
