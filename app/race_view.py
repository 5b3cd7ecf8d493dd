"""The Race tab: the ways to speed up the same target, run one after another on the prompt.

The user ticks methods (engine/tools/race.py's METHODS; AR always runs, first, as the reference)
and, for draft-model, a draft model and its draft count. The table shows per method what
`bench --methods` prints for one prompt: tok/s, speedup against the race's AR run, tau and
whether the output is AR's. Selecting a row emits `method_selected(name)`: the window then shows
that run's rounds, output and plots. The view knows nothing of threads: the controller feeds it
the runs' records and the worker's MethodDone / RaceDone messages.
"""

from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QFileDialog, QFrame, QGridLayout, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
    QPushButton, QScrollArea, QSpinBox, QTableWidget, QTableWidgetItem, QToolButton, QVBoxLayout, QWidget,
)

from engine.decode.settings import MAX_NUM_DRAFT, NUM_DRAFT
from engine.tools.parity import IDENTICAL, NEAR_TIE, SAMPLES, parity_verdict
from engine.tools.race import METHODS
from app import theme
from app.jobs import MethodDone, RaceDone
from app.parity_view import run_conditions
from app.run_record import RunRecord
from app.settings import AppSettings, DEFAULT_RACE_METHODS

METHOD_TIPS = {
    "ar": "plain autoregressive decoding: the reference, always run first",
    "dflash": "the DFlash drafter drafts a block each round (the drafter's fixed size, no copies); the target "
              "verifies it",
    "dflash-auto": "DFlash with the auto verify length, no copies (--no-lookup): each round verifies as many "
                   "drafts as pay off here",
    "lookup": "no drafter: where the text repeats the context, the target verifies the copied continuation",
    "dflash+lookup": "what a DFlash run does by default: auto verify length, and rounds that verify a copied "
                     "span of the context instead of the drafter's block where the text repeats it",
    "dflash-tree": "DFlash+lookup verifying a draft tree each round: the drafter's second choices beside its "
                   "chain in one forward, sized by the cost curve (--tree auto), a copy grafted as a branch",
    "draft-model": "classic speculation: a small autoregressive model with the target's tokenizer drafts "
                   "a few tokens one by one",
}
COLUMNS = ("method", "tok/s", "speedup", "τ", "tokens", "vs AR")
COLUMN_TIPS = ("the method (select a row: its rounds, output and plots are shown)",
               "generated tokens over decode time (prefill excluded)",
               "tok/s over the race's AR run's",
               "mean acceptance length (tau): tokens a round commits, the bonus counted",
               "tokens generated",
               "whether the output is AR's token for token (at temperature > 0: two samples, compared only "
               "in distribution); hover for the engine's verdict")
MARKS = {IDENTICAL: "✓ identical", SAMPLES: "~ samples"}
VERDICT_COLOUR = {IDENTICAL: "#7fd19b", SAMPLES: theme.FOREGROUND, NEAR_TIE: "#e5c07b"}


def verdict_cell(done: MethodDone, run: Optional[RunRecord]) -> tuple[str, str, str]:
    """(text, tooltip, kind) of a method's comparison with AR: the engine's parity verdict at the run's
    temperature and logits dtype, as the Parity tab gives it."""
    if done.method == "ar":
        return "reference", "the race's AR run: every other method is compared with its output", "reference"
    if done.cancelled:
        return "stopped", "stopped before the end: nothing to compare", "stopped"
    temperature, dtype = run_conditions(run) if run is not None else (0.0, "float32")
    verdict = parity_verdict(done.identical, done.first_divergence, done.margin_at_divergence, temperature, dtype,
                             method=done.method)
    first = done.first_divergence
    text = MARKS.get(verdict.kind, f"≈ near-tie at {first}" if verdict.kind == NEAR_TIE else f"✗ differs at {first}")
    return text, verdict.text, verdict.kind


class RaceView(QWidget):
    race_requested = Signal()
    stop_requested = Signal()
    method_selected = Signal(str)
    race_kept = Signal(bool)  # True when a race's table is complete (its export has something to write)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("raceView")
        hint = QLabel("Each ticked method decodes the prompt in turn (AR first) with the Prompt panel's settings; "
                      "select a row for its rounds, output and plots.")
        hint.setObjectName("hint")
        hint.setWordWrap(True)
        self.boxes: dict[str, QCheckBox] = {}
        ticks = QGridLayout()
        for i, method in enumerate(METHODS):
            box = QCheckBox(theme.METHOD_LABEL[method])
            box.setToolTip(METHOD_TIPS[method])
            box.setChecked(method in DEFAULT_RACE_METHODS)
            self.boxes[method] = box
            ticks.addWidget(box, i // 3, i % 3)
        self.boxes["ar"].setEnabled(False)  # the reference: always run

        self.draft_model = QLineEdit()
        self.draft_model.setPlaceholderText("draft model: a folder or a Hugging Face id")
        self.draft_model.setToolTip("a small autoregressive model with the target's tokenizer")
        self.browse = QToolButton()
        self.browse.setText("…")
        self.browse.setToolTip("choose a draft model folder")
        self.browse.clicked.connect(self._browse)
        self.num_draft = QSpinBox(minimum=1, maximum=MAX_NUM_DRAFT, value=NUM_DRAFT)
        self.num_draft.setToolTip("tokens the draft model drafts a round")
        draft = QHBoxLayout()
        draft.addWidget(self.draft_model, 1)
        draft.addWidget(self.browse)
        draft.addWidget(QLabel("drafts"))
        draft.addWidget(self.num_draft)
        self.boxes["draft-model"].toggled.connect(self._draft_model_ticked)
        self._draft_model_ticked(self.boxes["draft-model"].isChecked())

        self.race_button = QPushButton("Race")
        self.race_button.setObjectName("runButton")
        self.race_button.clicked.connect(self.race_requested)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop_requested)
        buttons = QHBoxLayout()
        buttons.addLayout(ticks, 1)
        buttons.addWidget(self.race_button)
        buttons.addWidget(self.stop_button)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        for col, tip in enumerate(COLUMN_TIPS):
            self.table.horizontalHeaderItem(col).setToolTip(tip)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.table.currentCellChanged.connect(lambda row, _c, _r, _pc: self._picked(row))
        self.table.cellClicked.connect(lambda row, _c: self._picked(row))

        inner = QWidget()
        lay = QVBoxLayout(inner)
        lay.addWidget(hint)
        lay.addLayout(buttons)
        lay.addLayout(draft)
        lay.addWidget(self.table, 1)
        # Scrolled when the centre column is narrower than the ticks (a small screen): the tab then
        # asks for no more width than the other tabs do.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(inner)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        self.rows: list[str] = []
        self.results: dict[str, MethodDone] = {}
        self.done: Optional[RaceDone] = None
        self._quiet = False

    # ---- controls ---------------------------------------------------------------------------

    def methods(self) -> list[str]:
        """The ticked methods in race order (AR first)."""
        return ["ar"] + [m for m, box in self.boxes.items() if box.isChecked() and m != "ar"]

    def set_methods(self, methods: list[str]) -> None:
        for method, box in self.boxes.items():
            box.setChecked(method == "ar" or method in methods)

    def apply(self, s: AppSettings) -> None:
        """The ticks, draft model and draft count the last session left."""
        self.set_methods(s.race_methods)
        self.draft_model.setText(s.race_draft_model)
        self.num_draft.setValue(s.race_num_draft)

    def store(self, s: AppSettings) -> None:
        s.race_methods = self.methods()
        s.race_draft_model = self.draft_model.text().strip()
        s.race_num_draft = self.num_draft.value()

    def draft_model_value(self) -> Optional[str]:
        text = self.draft_model.text().strip()
        return text if text and self.boxes["draft-model"].isChecked() else None

    def _draft_model_ticked(self, on: bool) -> None:
        for w in (self.draft_model, self.browse, self.num_draft):
            w.setEnabled(on)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a draft model folder", self.draft_model.text())
        if folder:
            self.draft_model.setText(folder)

    def set_running(self, running: bool) -> None:
        self.race_button.setEnabled(not running)
        self.stop_button.setEnabled(running)

    # ---- the table --------------------------------------------------------------------------

    def clear(self) -> None:
        self._quiet = True
        self.table.setRowCount(0)
        self._quiet = False
        self.rows, self.results, self.done = [], {}, None
        self.race_kept.emit(False)

    def start(self, methods: list[str]) -> None:
        """A row per method, waiting, before anything runs."""
        self.clear()
        self.rows = list(methods)
        self._quiet = True
        self.table.setRowCount(len(methods))
        for row, method in enumerate(methods):
            self._set_row(row, [theme.METHOD_LABEL.get(method, method), "", "", "", "", "waiting"])
            self.table.item(row, 0).setForeground(QColor(theme.PLOT_METHOD.get(method, theme.FOREGROUND)))
        self._quiet = False

    def refresh(self, runs: dict[str, RunRecord]) -> None:
        """Live figures of the method running (and any not reported yet)."""
        for row, method in enumerate(self.rows):
            run = runs.get(method)
            if run is None or method in self.results:
                continue
            tps, tau = run.tok_per_s, run.tau
            self._set_row(row, [None, f"{tps:.1f}" if tps is not None else "", "",
                                f"{tau:.2f}" if tau is not None else "", str(len(run.tokens)), "running…"])

    def set_result(self, done: MethodDone, run: Optional[RunRecord]) -> None:
        """A method's final figures (the engine's, against the race's AR run) and verdict."""
        if done.method not in self.rows:
            return
        self.results[done.method] = done
        f = done.figures
        speedup = "×1.00" if done.method == "ar" else f"×{f['speedup']:.2f}" if f.get("speedup") else "–"
        tau = f.get("mean_acceptance_length")
        text, tip, kind = verdict_cell(done, run)
        row = self.rows.index(done.method)
        self._set_row(row, [None, f"{f['dflash_tok_s']:.1f}", speedup, f"{tau:.2f}" if tau else "–",
                            str(f["dflash_tokens"]), text])
        verdict = self.table.item(row, len(COLUMNS) - 1)
        verdict.setToolTip(tip)
        muted = kind in ("reference", "stopped")
        verdict.setForeground(QColor(VERDICT_COLOUR.get(kind) or (theme.MUTED if muted else "#ef8a8a")))

    def finish(self, done: RaceDone) -> None:
        self.done = done
        for row, method in enumerate(self.rows):
            if method not in self.results:
                self._set_row(row, [None, "", "", "", "", "not run"])
        self.race_kept.emit(bool(self.rows))

    def cell(self, method: str, column: str) -> str:
        """The text of a method's cell (`column` one of COLUMNS)."""
        item = self.table.item(self.rows.index(method), COLUMNS.index(column))
        return item.text() if item is not None else ""

    def _set_row(self, row: int, texts: list[Optional[str]]) -> None:
        for col, text in enumerate(texts):
            if text is None:
                continue
            item = self.table.item(row, col)
            if item is None:
                item = QTableWidgetItem()
                if 0 < col < len(COLUMNS) - 1:  # figures right-aligned; the method and the verdict read as text
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(row, col, item)
            item.setText(text)

    # ---- selection --------------------------------------------------------------------------

    def mark_shown(self, method: str) -> None:
        """Select the row of the method the rounds view shows, without echoing `method_selected`."""
        if method in self.rows:
            self._quiet = True
            self.table.selectRow(self.rows.index(method))
            self._quiet = False

    def select_method(self, method: str) -> None:
        """Select a method's row as a user would: its run is shown."""
        row = self.rows.index(method)
        if self.table.currentRow() == row:  # already current (the view was following it): no change signal
            self._picked(row)
        else:
            self.table.setCurrentCell(row, 0)

    def _picked(self, row: int) -> None:
        if not self._quiet and 0 <= row < len(self.rows):
            self.method_selected.emit(self.rows[row])
