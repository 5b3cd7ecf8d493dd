"""Target and drafter pickers, the doctor's inline verdict, and loading progress."""

from __future__ import annotations

import logging

from pathlib import Path
from typing import Optional

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import (
    QComboBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy,
    QToolButton, QVBoxLayout, QWidget,
)

from app.catalog import DRAFTER, TARGET, ModelEntry, drafter_verdict, folder_role

NO_DRAFTER = "(no drafter: AR only)"
VALUE_ROLE = Qt.ItemDataRole.UserRole + 1
EMPTY_HINT = ("No model chosen yet{demo}. Pick a model folder with “…”, drop a folder on the window, "
              "or choose one from the Hugging Face cache.")


WARN_COLOUR = "#e5c07b"  # as QLabel#verdictWarn in resources/styles/app.qss


def dot_icon(colour: str) -> QIcon:
    pix = QPixmap(12, 12)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setBrush(QColor(colour))
    p.setPen(Qt.PenStyle.NoPen)
    p.drawEllipse(2, 2, 8, 8)
    p.end()
    return QIcon(pix)


log = logging.getLogger("app.models_panel")

class ModelPicker(QWidget):
    """An editable combo (folder, HF id, or a listed model) and a folder browser."""

    changed = Signal()

    def __init__(self, role: str, parent=None):
        super().__init__(parent)
        self.role = role
        self.combo = QComboBox()
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(18)
        self.combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.combo.lineEdit().setPlaceholderText("folder or Hugging Face id" if role == TARGET
                                                 else "drafter folder or id (empty: AR only)")
        self.browse = QToolButton()
        self.browse.setText("…")
        self.browse.setToolTip(f"Choose a {role} folder")
        self.browse.clicked.connect(self._browse)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.combo, 1)
        row.addWidget(self.browse)
        self.combo.currentTextChanged.connect(lambda _t: self.changed.emit())
        self.entries: list[ModelEntry] = []

    def value(self) -> str:
        """What to load: the listed model's folder/id, or the typed text."""
        text = self.combo.currentText().strip()
        if not text or text == NO_DRAFTER:
            return ""
        i = self.combo.findText(text, Qt.MatchFlag.MatchExactly)
        if i >= 0:
            data = self.combo.itemData(i, VALUE_ROLE)
            if data is not None:
                return data
        return text

    def set_value(self, value: str) -> None:
        for i in range(self.combo.count()):
            if self.combo.itemData(i, VALUE_ROLE) == value:
                self.combo.setCurrentIndex(i)
                return
        # No listed item may stay current under typed text: updating that item's data
        # (the fit marks do, when the target changes) would put its text back.
        self.combo.setCurrentIndex(-1)
        self.combo.setEditText(value)

    def set_entries(self, entries: list[ModelEntry]) -> None:
        """Replace the list, keeping what is selected or typed."""
        current = self.value()
        self.entries = list(entries)
        self.combo.blockSignals(True)
        self.combo.clear()
        if self.role == DRAFTER:
            self.combo.addItem(NO_DRAFTER)
            self.combo.setItemData(0, "", VALUE_ROLE)
        for e in entries:
            self.combo.addItem(e.label)
            i = self.combo.count() - 1
            self.combo.setItemData(i, e.value, VALUE_ROLE)
            self.combo.setItemData(i, f"{e.value}\n({e.source})", Qt.ItemDataRole.ToolTipRole)
        self.combo.setCurrentIndex(-1)
        self.set_value(current)
        self.combo.blockSignals(False)
        self.changed.emit()

    def mark(self, value: str, ok: Optional[bool], why: str) -> None:
        """Show whether a listed drafter fits the chosen target (None: it loads, with a warning)."""
        colour, sign = {True: ("#4caf7a", "✓"), None: (WARN_COLOUR, "⚠"), False: ("#e06c75", "✗")}[ok]
        for i in range(self.combo.count()):
            if self.combo.itemData(i, VALUE_ROLE) == value:
                self.combo.setItemIcon(i, dot_icon(colour))
                self.combo.setItemData(i, f"{value}\n{sign} {why}", Qt.ItemDataRole.ToolTipRole)

    def marks(self) -> dict[str, str]:
        """value -> tooltip, for listed entries."""
        return {self.combo.itemData(i, VALUE_ROLE): self.combo.itemData(i, Qt.ItemDataRole.ToolTipRole)
                for i in range(self.combo.count()) if self.combo.itemData(i, VALUE_ROLE)}

    def _browse(self) -> None:
        # beside the current model's folder (the others are its siblings), not inside it
        start = str(Path(self.value()).parent) if self.value() and Path(self.value()).is_dir() else str(Path.home())
        folder = QFileDialog.getExistingDirectory(self, f"Choose the {self.role} folder", start)
        if folder:
            self.set_value(folder)


class ModelsPanel(QGroupBox):
    load_requested = Signal()
    cancel_requested = Signal()
    selection_changed = Signal()

    def __init__(self, parent=None):
        super().__init__("Models", parent)
        self.target = ModelPicker(TARGET)
        self.drafter = ModelPicker(DRAFTER)
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.memory = QLabel()  # the pair's memory needs against this machine's, before a load
        self.memory.setWordWrap(True)
        self.memory.setObjectName("hint")
        self.memory.setToolTip("Weights (the files' sizes) plus the KV cache at the target's full context, "
                               "against this machine's memory. On a Mac the GPU may use only about three "
                               "quarters of it.")
        self.memory.setVisible(False)
        self.memory_fits: Optional[bool] = None
        self.load_button = QPushButton("Load")
        self.load_button.setToolTip("Load the pair now (Run also loads it when needed)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setVisible(False)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setVisible(False)
        self.status = QLabel("no pair loaded")
        self.status.setObjectName("hint")
        self.status.setWordWrap(True)

        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow("Target", self.target)
        form.addRow("Drafter", self.drafter)
        buttons = QHBoxLayout()
        buttons.addWidget(self.load_button)
        buttons.addWidget(self.progress, 1)
        buttons.addWidget(self.cancel_button)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.verdict)
        lay.addWidget(self.memory)
        lay.addLayout(buttons)
        lay.addWidget(self.status)

        self.load_button.clicked.connect(self.load_requested)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self._check_timer = QTimer(self, singleShot=True, interval=250)
        self._check_timer.timeout.connect(self.check_now)
        self.target.changed.connect(self._changed)
        self.drafter.changed.connect(self._changed)
        self._marked_for: Optional[str] = None
        self.demo_installed = False
        self.verdict_ok: Optional[bool] = None

    # ---- values -----------------------------------------------------------------------------

    def target_value(self) -> str:
        return self.target.value()

    def drafter_value(self) -> Optional[str]:
        return self.drafter.value() or None

    def accept_folder(self, folder: str) -> Optional[str]:
        """Put a dropped folder in the picker its config says it belongs to; returns the role."""
        role = folder_role(folder)
        if role == DRAFTER:
            self.drafter.set_value(folder)
        elif role == TARGET:
            self.target.set_value(folder)
        return role

    def choose_pair_of(self, header: dict) -> Optional[str]:
        """An opened trace's pair in the pickers, where its folders still exist here, so Run runs it
        again on the pair it was made with; a trace without a drafter (AR) leaves the drafter picker
        alone. Returns what could not be chosen (a folder moved, deleted, or another machine's), since
        Run would then use the pickers' pair: the user must know it is not the trace's."""
        missing = []
        for picker, value in ((self.target, header.get("target")), (self.drafter, header.get("drafter"))):
            if not isinstance(value, str):
                continue
            if not Path(value).is_dir():
                relative = "" if Path(value).is_absolute() else " (a path relative to the folder the trace was made in)"
                missing.append(f"{'target' if picker is self.target else 'drafter'} {value}{relative}")
            elif not missing and picker.value() != value:  # never the trace's drafter beside another target
                picker.set_value(value)
        if not missing:
            return None
        return (f"this trace's {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on this machine "
                "(moved, deleted, or another machine's): its rounds are shown, but Run would use the pair "
                "chosen in the Models panel, not the trace's.")

    # ---- doctor -----------------------------------------------------------------------------

    def _changed(self) -> None:
        self._check_timer.start()
        self.selection_changed.emit()

    def check_now(self) -> None:
        """The doctor's verdict for the current choice, from files only (fast, no download)."""
        from engine.models.doctor import check_pair

        self._check_timer.stop()
        target, drafter = self.target_value(), self.drafter_value()
        self._show_memory(target, drafter)
        if not target:
            demo = "" if self.demo_installed else " and the demo pair is not installed yet"
            self._set_verdict(None, EMPTY_HINT.format(demo=demo))
            return
        try:
            report = check_pair(target, drafter, download=False, kernels=False)
        except Exception as exc:  # noqa: BLE001 - a doctor bug must not stop the window (or its start)
            log.exception("the doctor failed on %s + %s", target, drafter)
            self._set_verdict(False, f"✗ could not check this pair ({type(exc).__name__}: {exc}).")
            return
        if report.ok:
            facts = report.facts
            what = f"{facts.get('target_model_type', '?')} target, {facts.get('target_num_hidden_layers', '?')} layers"
            if drafter:
                what += (f"; {facts.get('drafter_generation', 'DFlash')} drafter {facts.get('drafter_layers')} layers, "
                         f"block {facts.get('block_size')}" + (f", {facts['selector']}" if facts.get("selector") else ""))
            else:
                what += "; no drafter, so AR only"
            head = "⚠ ready, with a warning" if report.warnings else "✓ ready"
            self._set_verdict(True, f"{head}: {what}" + "".join(f"\n⚠ {w}" for w in report.warnings),
                              warned=bool(report.warnings))
        else:
            self._set_verdict(False, f"✗ {report.problems[0]}")
        if target != self._marked_for:
            self._marked_for = target
            for e in self.drafter.entries:
                ok, why = drafter_verdict(target, e.value)
                self.drafter.mark(e.value, ok, why)

    def _show_memory(self, target: str, drafter: Optional[str]) -> None:
        """One line: does the pair fit this machine's memory? From config.json and file sizes only,
        so cheap enough here; hidden where the folders cannot be read (the verdict says why)."""
        from engine.models import memory_fit

        try:
            estimate = memory_fit.estimate_pair(target, drafter) if target else None
        except Exception:  # noqa: BLE001 - an estimate bug must not stop the window
            log.exception("the memory estimate failed on %s + %s", target, drafter)
            estimate = None
        self.memory_fits = estimate.fits if estimate is not None else None
        self.memory.setVisible(estimate is not None)
        if estimate is not None:
            self.memory.setText(f"Memory: {estimate.line()}")
            self.memory.setObjectName("verdictBad" if estimate.fits is False else "hint")
            self.memory.style().unpolish(self.memory)
            self.memory.style().polish(self.memory)

    def _set_verdict(self, ok: Optional[bool], text: str, warned: bool = False) -> None:
        """ok: green (amber where it loads with warnings), not ok: red, None: a hint."""
        self.verdict_ok = ok
        name = "verdictOk" if ok else ("verdictBad" if ok is False else "hint")
        self.verdict.setObjectName("verdictWarn" if ok and warned else name)
        self.verdict.setText(text)
        self.verdict.style().unpolish(self.verdict)
        self.verdict.style().polish(self.verdict)

    def set_entries(self, targets: list[ModelEntry], drafters: list[ModelEntry]) -> None:
        self.target.set_entries(targets)
        self.drafter.set_entries(drafters)
        self._marked_for = None
        self._check_timer.start()

    # ---- loading ----------------------------------------------------------------------------

    def set_loading(self, loading: bool) -> None:
        self.progress.setVisible(loading)
        self.cancel_button.setVisible(loading)
        self.load_button.setEnabled(not loading)
        if loading:
            self.progress.setValue(0)

    def set_progress(self, stage: str, frac: float) -> None:
        self.progress.setValue(int(round(frac * 100)))
        self.progress.setFormat(f"{stage} %p%")
        self.status.setText(stage + "…")
