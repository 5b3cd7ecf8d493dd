"""Colours (one place, so the output, the chips and the plots agree) and the window style."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QIcon, QPalette
from PySide6.QtWidgets import QApplication

from app.paths import resources_dir
from app.run_record import ACCEPTED, AR, BONUS, CORRECTION, PLAIN, PREFILL

BACKGROUND = "#1b1d23"
PANEL = "#22252c"
FOREGROUND = "#d5d8de"
MUTED = "#8b919c"

# Provenance backgrounds in the output; None draws the text plain.
KIND_BACKGROUND = {
    ACCEPTED: "#245c3b",
    BONUS: "#23508a",
    CORRECTION: "#8a4f1c",
    AR: None,
    PLAIN: None,
    PREFILL: None,
}
KIND_LABEL = {
    ACCEPTED: "accepted draft",
    BONUS: "bonus (all drafts accepted)",
    CORRECTION: "correction (first rejected draft replaced)",
    AR: "plain AR",
    PLAIN: "plain step (auto skipped the drafter)",
    PREFILL: "from prefill",
}

CHIP_ACCEPTED = "#2f7a4e"
CHIP_REJECTED = "#3a3d45"
CHIP_REJECTED_TEXT = "#e06c75"
CHIP_BONUS = "#2f6bb5"
CHIP_CORRECTION = "#b3691f"
CHIP_ANCHOR = "#6b7280"
CHIP_TREE = "#56b6c2"  # a tree round's tag in the rounds table; a second choice taken, in the Tree tab

ROUND_HIGHLIGHT = "#e5c07b"
DIFF_MARK = "#b33a3a"
DIFF_SAMPLE = "#4a5060"  # a difference between two samples (T > 0): no error, so not red
DIFF_NEAR_TIE = "#8a6d1c"  # a near-tie flip (floating point at a margin below the dtype's threshold): amber

# Where a round's drafts came from (RoundEvent.source, engine/decode/proposers.py): the left edge of
# each drafted chip in the rounds view.
CHIP_SOURCE = {"drafter": "#61afef", "lookup": "#e5c07b", "draft-model": "#c678dd"}
SOURCE_LABEL = {"drafter": "DFlash drafter", "lookup": "lookup (copied from the context)",
                "draft-model": "draft model"}

PLOT_DFLASH = "#4caf7a"
PLOT_AR = "#9aa0a6"
PLOT_DRAFT = "#61afef"
PLOT_VERIFY = "#c678dd"
PLOT_ROLLBACK = "#e5c07b"

# The race's methods (engine/tools/race.py METHODS): their names in the window and throughput curves.
METHOD_LABEL = {"ar": "AR", "dflash": "DFlash", "dflash-auto": "DFlash auto", "lookup": "lookup",
                "dflash+lookup": "DFlash+lookup", "dflash-tree": "DFlash tree", "draft-model": "draft model"}
PLOT_METHOD = {"ar": PLOT_AR, "dflash": PLOT_DFLASH, "dflash-auto": "#56b6c2", "lookup": "#e5c07b",
               "dflash+lookup": "#d19a66", "dflash-tree": "#e06c75", "draft-model": "#c678dd"}


def apply_theme(app: QApplication) -> None:
    """Fusion with a dark palette plus resources/styles/app.qss; pyqtgraph to match."""
    import pyqtgraph as pg

    app.setStyle("Fusion")
    pal = QPalette()
    for role, colour in (
        (QPalette.ColorRole.Window, PANEL),
        (QPalette.ColorRole.WindowText, FOREGROUND),
        (QPalette.ColorRole.Base, BACKGROUND),
        (QPalette.ColorRole.AlternateBase, PANEL),
        (QPalette.ColorRole.Text, FOREGROUND),
        (QPalette.ColorRole.Button, "#2c3038"),
        (QPalette.ColorRole.ButtonText, FOREGROUND),
        (QPalette.ColorRole.Highlight, "#3d5a80"),
        (QPalette.ColorRole.HighlightedText, "#ffffff"),
        (QPalette.ColorRole.ToolTipBase, "#2c3038"),
        (QPalette.ColorRole.ToolTipText, FOREGROUND),
        (QPalette.ColorRole.PlaceholderText, MUTED),
    ):
        pal.setColor(role, QColor(colour))
    pal.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor(MUTED))
    pal.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor(MUTED))
    app.setPalette(pal)
    qss = resources_dir() / "styles" / "app.qss"
    if qss.is_file():
        icons = (resources_dir() / "icons").as_posix()
        app.setStyleSheet(qss.read_text(encoding="utf-8").replace("url(ICONS/", f"url({icons}/"))
    icon = resources_dir() / "icons" / "app-icon.svg"
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    # No antialiasing: it makes filled plots several times dearer to repaint (docs/performance.md).
    pg.setConfigOptions(background=BACKGROUND, foreground=FOREGROUND, antialias=False)


def chip_font(points: float) -> QFont:
    """The monospace font of token chips (the rounds table, the Selector, the Tree tab)."""
    font = QFont("DejaVu Sans Mono")
    font.setStyleHint(QFont.StyleHint.Monospace)
    font.setPointSizeF(points)
    return font
