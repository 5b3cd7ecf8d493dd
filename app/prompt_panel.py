"""The prompt editor, prompt format, sampling settings, mode, and Run / Stop."""

from __future__ import annotations

from typing import Optional, Sequence

from PySide6.QtCore import QSize, Signal
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QCheckBox, QButtonGroup, QComboBox, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout, QLabel,
    QPlainTextEdit, QPushButton, QRadioButton, QVBoxLayout, QWidget,
)

from engine.decode.prompts import PROMPT_FORMATS
from engine.decode.settings import (
    DEFAULTS, LOOKUP_MAX_DRAFT, MAX_BLOCK, MAX_DRAFT_CONTEXT, MAX_TEMPERATURE, MAX_TOKENS_LIMIT, MAX_TREE,
    GenerationSettings, SamplingSettings,
)
from app.number_boxes import ClampedDoubleSpinBox, ClampedSpinBox
from app.settings import AppSettings
from engine.json_text import is_int, is_number

FORMATS = (("auto", "Auto (chat template if any)"), ("chat", "Chat template"), ("raw", "Raw text"))
THINKING = (("default", "Default"), ("on", "On"), ("off", "Off"))
BOX_MIN_WIDTH = 72  # px: a spin box's least width (typical values show whole; its tooltip says the range)
MODE_CHOICES = (("dflash", "DFlash"), ("ar", "AR"), ("both", "Both (parity)"))


class PromptEditor(QPlainTextEdit):
    """The prompt box: it asks for four lines and grows into whatever height the column has left. Qt's
    own asks for ~190 px, and inside the settings column's scroll area (a short screen) that pushed
    the sampling settings below the fold, or made a 1280x800 column scroll by 11 px."""

    def sizeHint(self) -> QSize:  # noqa: N802
        lines = self.fontMetrics().lineSpacing() * 4
        return QSize(super().sizeHint().width(), lines + 2 * int(self.document().documentMargin()) + 2 * self.frameWidth())


class PromptPanel(QGroupBox):
    notice = Signal(str)  # a typed number clamped to its box's range, saying from what

    def __init__(self, parent=None):
        super().__init__("Prompt", parent)
        self.editor = PromptEditor()
        self.editor.setObjectName("promptEditor")
        self.editor.setPlaceholderText("Type a prompt. Ctrl+Enter runs it, Esc stops.")
        self.editor.setTabChangesFocus(True)

        self.format = QComboBox()
        for key, label in FORMATS:
            self.format.addItem(label, key)
        self.format.setToolTip("Through the chat template the prompt is one user message, or a whole chat when "
                               "it is one: a JSON list of {\"role\": ..., \"content\": ...} messages (OpenAI's "
                               "format; ending with an assistant message continues it). Raw: the text as it is.")
        self.thinking = QComboBox()
        for key, label in THINKING:
            self.thinking.addItem(label, key)
        self.thinking.setEnabled(False)
        self.thinking.setToolTip("Only for chat templates with a thinking mode (load the pair to find out)")

        self.temperature = ClampedDoubleSpinBox("temperature", decimals=2, minimum=0.0, maximum=MAX_TEMPERATURE, singleStep=0.1)
        self.temperature.setToolTip("0 is greedy: DFlash must then equal AR token for token")
        self.top_p = ClampedDoubleSpinBox("top-p", decimals=2, minimum=0.01, maximum=1.0, singleStep=0.05, value=1.0)
        self.top_k = ClampedSpinBox("top-k", minimum=0, maximum=1_000_000)
        self.top_k.setSpecialValueText("off")
        self.seed = ClampedSpinBox("seed", minimum=0, maximum=2_147_483_647)
        self.max_tokens = ClampedSpinBox("max tokens", minimum=1, maximum=MAX_TOKENS_LIMIT, value=DEFAULTS.max_tokens)
        self.block_size = ClampedSpinBox("block size", minimum=0, maximum=MAX_BLOCK)
        self.block_size.setSpecialValueText("drafter's")
        self.block_auto = QCheckBox("auto verify length")
        self.block_auto.setToolTip("Each round the target verifies only as many drafts as pay off on this machine "
                                   "(the cost curve, measured once, and the acceptance so far); the block size "
                                   "caps it. Lossless like any block size.")
        self.lookup = QCheckBox("copy lookup")
        self.lookup.setToolTip("Where the text being written repeats earlier text (a pasted file being edited, a "
                               "loop), a round verifies the copied continuation, up to "
                               f"{LOOKUP_MAX_DRAFT} tokens, instead of the drafter's block. "
                               "Lossless: verified like any draft (at temperature 0 a copied token is kept "
                               "only where it is the target's own choice).")
        self.tree = ClampedSpinBox("draft tree", minimum=0, maximum=MAX_TREE)
        self.tree.setSpecialValueText("chain")
        self.tree.setToolTip(f"Each DFlash round verifies a draft tree of this many draft nodes (1..{MAX_TREE}) in "
                             "one forward: the drafter's second choices beside its first, the longest path the "
                             "target agrees with committed (docs/trees.md). Chain: one path, the first choices. "
                             "Lossless either way.")
        self.tree_auto = QCheckBox("auto tree")
        self.tree_auto.setToolTip("Each round's tree sized by the cost curve and this run's acceptance, the chain "
                                  "where a tree does not pay (--tree auto, the command line's default). A target "
                                  "no tree can serve (hybrid) verifies the chain.")
        self.tree_auto.toggled.connect(lambda on: self.tree.setEnabled(not on))

        self.draft_window = ClampedSpinBox("draft window", minimum=0, maximum=MAX_DRAFT_CONTEXT, value=DEFAULTS.draft_window, singleStep=64)
        self.draft_window.setSpecialValueText("whole context")
        self.draft_window.setToolTip("The drafter sees only the last N positions of the context (its full-attention "
                                     "layers; sliding ones keep their trained window). A drafter trained on short "
                                     "windows drafts better deep in a long prompt with a window near its training "
                                     "length. Lossless whatever it is. With auto verify length, the first run "
                                     "at a new window or sink measures the drafter's cost there (seconds; kept "
                                     "for the next runs).")
        self.draft_sink = ClampedSpinBox("draft sink", minimum=0, maximum=MAX_DRAFT_CONTEXT, value=DEFAULTS.draft_sink)
        self.draft_sink.setToolTip("...and the first N positions of the context, beside the window (a new value "
                                   "is measured once, as the window is)")
        self.draft_window.valueChanged.connect(lambda w: self.draft_sink.setEnabled(w > 0))
        for box in (self.temperature, self.top_p, self.top_k, self.seed, self.max_tokens, self.block_size,
                    self.draft_window, self.draft_sink, self.tree):
            box.clamped.connect(self.notice)
            # not as wide as the largest value each takes (a seed's 10 digits): the column narrows on a
            # 1024-pixel screen, where the centre had ~550 px and the rounds header read "ock: anchor"
            box.setMinimumWidth(BOX_MIN_WIDTH)

        self.mode_group = QButtonGroup(self)
        self.mode_buttons: dict[str, QRadioButton] = {}
        modes = QHBoxLayout()
        for key, label in MODE_CHOICES:
            b = QRadioButton(label)
            self.mode_group.addButton(b)
            self.mode_buttons[key] = b
            modes.addWidget(b)
        self.mode_buttons["dflash"].setChecked(True)

        self.run_button = QPushButton("Run  (Ctrl+Enter)")
        self.run_button.setObjectName("runButton")
        self.stop_button = QPushButton("Stop  (Esc)")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setEnabled(False)

        form = QFormLayout()
        form.addRow("Format", self.format)
        form.addRow("Thinking", self.thinking)
        grid = QGridLayout()
        for i, (label, w) in enumerate((("Temperature", self.temperature), ("Top-p", self.top_p),
                                        ("Top-k", self.top_k), ("Seed", self.seed),
                                        ("Max tokens", self.max_tokens), ("Block size", self.block_size),
                                        ("Draft window", self.draft_window), ("Draft sink", self.draft_sink),
                                        ("Draft tree", self.tree))):
            row = i // 2 + (i >= 6)  # row 3 holds the copy lookup and auto verify length boxes
            grid.addWidget(QLabel(label), row, (i % 2) * 2)
            grid.addWidget(w, row, (i % 2) * 2 + 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button, 2)
        buttons.addWidget(self.stop_button, 1)
        lay = QVBoxLayout(self)
        lay.addWidget(self.editor, 1)
        lay.addLayout(form)
        grid.addWidget(self.lookup, 3, 0, 1, 2)
        grid.addWidget(self.block_auto, 3, 2, 1, 2)
        grid.addWidget(self.tree_auto, 5, 2, 1, 2)
        lay.addLayout(grid)
        # The mode and Run / Stop: the window pins them below the settings column's scroll area, so
        # they stay on screen where the column does not fit (a laptop at 150% scaling).
        self.run_bar = QWidget()
        bar = QVBoxLayout(self.run_bar)
        bar.setContentsMargins(6, 0, 6, 6)
        bar.addLayout(modes)
        bar.addLayout(buttons)

    # ---- values -----------------------------------------------------------------------------

    def prompt(self) -> str:
        return self.editor.toPlainText()

    def set_prompt(self, text: str, undoable: bool = True) -> None:
        """Replace the prompt as one edit, so Ctrl+Z brings the text before it back (an opened trace,
        the demo's sample after a load); the same text again keeps the cursor and the history.
        `undoable=False`: the window's first text, with nothing before it to go back to."""
        if text == self.prompt():
            return
        if not undoable:
            self.editor.setPlainText(text)
            return
        cursor = self.editor.textCursor()
        cursor.select(QTextCursor.SelectionType.Document)
        cursor.insertText(text)
        cursor.movePosition(QTextCursor.MoveOperation.Start)
        self.editor.setTextCursor(cursor)

    def mode(self) -> str:
        return next(k for k, b in self.mode_buttons.items() if b.isChecked())

    def set_mode(self, mode: str) -> None:
        self.mode_buttons.get(mode, self.mode_buttons["dflash"]).setChecked(True)

    def chat_flag(self) -> Optional[bool]:
        return PROMPT_FORMATS[self.format.currentData()]

    def thinking_flag(self) -> Optional[bool]:
        if not self.thinking.isEnabled() or self.chat_flag() is False:  # raw text has no template to tell
            return None
        return {"default": None, "on": True, "off": False}[self.thinking.currentData()]

    def settings(self) -> GenerationSettings:
        """Engine settings; the engine itself checks them and says what is wrong."""
        sampling = SamplingSettings(
            temperature=round(self.temperature.value(), 4),
            top_p=round(self.top_p.value(), 4),
            top_k=self.top_k.value(),
            seed=self.seed.value(),
        )
        return GenerationSettings(
            max_tokens=self.max_tokens.value(),
            block_size=self.block_size.value() or None,
            sampling=sampling,
            auto=self.block_auto.isChecked(),
            lookup=self.lookup.isChecked(),
            draft_window=self.draft_window.value(),
            draft_sink=self.draft_sink.value() if self.draft_window.value() else 0,  # no sink beside the whole context
            tree=0 if self.tree_auto.isChecked() else self.tree.value(),
            tree_auto=self.tree_auto.isChecked(),
        )

    def set_capabilities(self, has_chat_template: bool, has_thinking: bool) -> None:
        self.thinking.setEnabled(has_chat_template and has_thinking)
        chat_index = self.format.findData("chat")
        item = self.format.model().item(chat_index)
        item.setEnabled(has_chat_template)
        if not has_chat_template and self.format.currentData() == "chat":
            self.format.setCurrentIndex(self.format.findData("raw"))

    def set_vocab_size(self, vocab_size: int) -> Optional[str]:
        """Top-k ranges over the loaded target's vocabulary; a notice when that cut its value, else None."""
        self.top_k.setToolTip(f"Sample among the k likeliest tokens, 1..{vocab_size - 1:,} (this target's "
                              "vocabulary); off keeps them all")
        return self.top_k.set_bound(max(vocab_size - 1, 1), f"this target's {vocab_size:,} tokens allow")

    def set_context(self, context: Optional[int]) -> Optional[str]:
        """Max tokens ranges up to the loaded target's context (the prompt takes its share at Run); a
        notice when that cut its value, else None."""
        if context is None:
            return self.max_tokens.set_bound(MAX_TOKENS_LIMIT, None)
        self.max_tokens.setToolTip(f"At most {context:,} tokens: this target's context, which the prompt "
                                   "shares (Run says how many are left after it)")
        return self.max_tokens.set_bound(min(context, MAX_TOKENS_LIMIT), f"this target's {context:,}-token "
                                          "context allows")

    def set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.stop_button.setEnabled(running)

    def apply_trace_header(self, header: dict, table: Optional[Sequence[str]] = None) -> None:
        """Show the prompt and settings an opened trace was run with (values of the wrong type are
        skipped; the spin boxes clamp the rest to their ranges)."""
        prompt = header.get("prompt") if isinstance(header.get("prompt"), dict) else {}
        text = prompt.get("text")
        if not isinstance(text, str) and table is not None:  # older traces: rebuild it from the ids
            ids = [i for i in header.get("prompt_ids") or [] if isinstance(i, int) and 0 <= i < len(table)]
            text = "".join(table[i] for i in ids) if ids else None
        if isinstance(text, str):
            self.set_prompt(text)
        if prompt.get("format") in PROMPT_FORMATS:
            self.format.setCurrentIndex(max(0, self.format.findData(prompt["format"])))
        if header.get("mode") in self.mode_buttons:  # lookup and draft-model runs are the Race tab's
            self.set_mode(header["mode"])
        settings = header.get("settings") if isinstance(header.get("settings"), dict) else {}
        for box, key in ((self.block_auto, "auto"), (self.lookup, "lookup"), (self.tree_auto, "tree_auto")):
            # an AR or draft-model run resolves both to false: that says nothing of a DFlash run's choice
            if header.get("mode") == "dflash" and isinstance(settings.get(key), bool):
                box.setChecked(settings[key])
        sampling = settings.get("sampling") if isinstance(settings.get("sampling"), dict) else {}
        block = settings.get("block_size") if header.get("mode") == "dflash" else None  # draft-model: num_draft + 1
        model = header.get("model") if isinstance(header.get("model"), dict) else {}
        if block is not None and block == model.get("block_size"):  # a run resolves "drafter's" to the drafter's own
            block = 0
        for box, value in ((self.max_tokens, settings.get("max_tokens")), (self.block_size, block),
                           (self.top_k, sampling.get("top_k")), (self.seed, sampling.get("seed")),
                           (self.draft_window, settings.get("draft_window")),
                           (self.draft_sink, settings.get("draft_sink")),
                           (self.tree, settings.get("tree") if header.get("mode") == "dflash" else None)):
            if is_int(value):
                box.setValue(min(max(value, box.minimum()), box.maximum()))
        for box, value in ((self.temperature, sampling.get("temperature")), (self.top_p, sampling.get("top_p"))):
            if is_number(value) and value == value:
                box.setValue(float(value))

    # ---- persistence ------------------------------------------------------------------------

    def apply(self, s: AppSettings) -> None:
        self.format.setCurrentIndex(max(0, self.format.findData(s.prompt_format)))
        self.thinking.setCurrentIndex(max(0, self.thinking.findData(s.thinking)))
        self.set_mode(s.mode)
        self.temperature.setValue(s.temperature)
        self.top_p.setValue(s.top_p)
        self.top_k.setValue(s.top_k)
        self.seed.setValue(s.seed)
        self.max_tokens.setValue(s.max_tokens)
        self.block_size.setValue(s.block_size)
        self.block_auto.setChecked(s.block_auto)
        self.lookup.setChecked(s.lookup)
        self.tree.setValue(s.tree)
        self.tree_auto.setChecked(s.tree_auto)
        self.tree.setEnabled(not s.tree_auto)
        self.draft_window.setValue(s.draft_window)
        self.draft_sink.setValue(s.draft_sink)

    def store(self, s: AppSettings) -> None:
        s.prompt = self.prompt()
        s.prompt_format = self.format.currentData()
        s.thinking = self.thinking.currentData()
        s.mode = self.mode()
        s.temperature = self.temperature.value()
        s.top_p = self.top_p.value()
        s.top_k = self.top_k.value()
        s.seed = self.seed.value()
        s.max_tokens = self.max_tokens.value()
        s.block_size = self.block_size.value()
        s.block_auto = self.block_auto.isChecked()
        s.lookup = self.lookup.isChecked()
        s.tree = self.tree.value()
        s.tree_auto = self.tree_auto.isChecked()
        s.draft_window = self.draft_window.value()
        s.draft_sink = self.draft_sink.value()
