"""A 1024x700 screen: the settings column narrows so the centre gets room (it had ~550 px), the rounds
header reads whole, and the Why and Selector tabs fit across."""

from PySide6.QtCore import QRect
from PySide6.QtWidgets import QScrollArea

from app.rounds_view import BLOCK_COLUMN, COLUMNS
from window_helpers import fake_screen, run_button_on_screen


def test_at_1024x700_the_centre_gets_the_room(qtbot, make_window, monkeypatch):
    available = QRect(0, 0, 1024, 700)
    fake_screen(monkeypatch, available)
    w = make_window()
    qtbot.waitExposed(w)
    run_button_on_screen(w, available)
    assert w.center_split.width() >= 600, w.main_split.sizes()  # it was 554
    header = w.rounds.horizontalHeader()
    text = header.fontMetrics().horizontalAdvance(COLUMNS[BLOCK_COLUMN])
    assert header.sectionSize(BLOCK_COLUMN) >= text + 12  # the header's text and its margins
    for view in (w.why_view, w.selector_view):
        w.center_tabs.setCurrentWidget(view)
        qtbot.waitUntil(view.isVisible)
        for area in view.findChildren(QScrollArea):
            if area.isVisible():
                assert area.horizontalScrollBar().maximum() == 0, type(view).__name__  # no sideways scrolling


def test_a_status_message_too_long_for_the_bar_ends_in_an_ellipsis_and_reads_whole_in_its_tooltip(qtbot, make_window,
                                                                                                  monkeypatch):
    from PySide6.QtWidgets import QStatusBar

    fake_screen(monkeypatch, QRect(0, 0, 1024, 700))
    w = make_window()
    qtbot.waitExposed(w)
    bar = w.statusBar()
    long = "saved the trace to /home/someone/exports/trace-both-20261129-015300.jsonl (both runs and the parity " \
        "verdict), with the prompt reused 8/8 from the AR run"
    bar.showMessage(long)
    shown = QStatusBar.currentMessage(bar)  # what the bar paints
    assert shown.endswith("…") and long.startswith(shown[:-1])
    assert bar.currentMessage() == bar.toolTip() == long
    bar.showMessage("saved")
    assert QStatusBar.currentMessage(bar) == bar.currentMessage() == bar.toolTip() == "saved"
    bar.clearMessage()
    assert bar.currentMessage() == bar.toolTip() == ""


def test_a_finished_runs_message_fits_beside_its_figures(qtbot, make_window, monkeypatch, qwen3_tied_dirs):
    """The figures grow when a run ends (tok/s of both runs): the message is cut again to the room they
    leave, not painted under them ("…from the AR rur")."""
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QStatusBar

    from helpers import PROMPTS
    from window_helpers import choose, run_and_wait

    fake_screen(monkeypatch, QRect(0, 0, 1024, 700))
    w = make_window()
    qtbot.waitExposed(w)
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=24, block_size=4, mode="both")
    run_and_wait(qtbot, w)
    bar = w.statusBar()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
    shown = QStatusBar.currentMessage(bar)
    edge = min(label.geometry().left() for label in w.status_labels.values())
    assert shown and bar.fontMetrics().horizontalAdvance(shown) <= edge
    assert bar.currentMessage().startswith(shown.rstrip("…")) and bar.toolTip() == bar.currentMessage()
