"""Rounds <-> output and selector: a round picked in the table, or a token clicked in the output, is
shown in the output (highlighted) and described in the Selector.

A pick brings the Output page forward (the Selector stays when it is on show), but never while the
tab bar is switching pages: hiding a page hands the keyboard focus on, and a table with no current
row takes its first row when it gets the focus.
"""

from __future__ import annotations

import weakref

from PySide6.QtWidgets import QTabWidget


def switching(tabs: QTabWidget) -> bool:
    """True inside a tab switch: the tab bar shows the new tab while the stack still holds the old page."""
    return tabs.tabBar().currentIndex() != tabs.indexOf(tabs.currentWidget())


class RoundLinks:
    """Wires the rounds table, the output and the Selector of `window` (app.window.MainWindow)."""

    def __init__(self, window):
        # weak, as the run controller's: a window <-> links cycle left closed windows to the garbage collector,
        # which ran on the worker thread's gc.collect() and deadlocked freeing Qt objects (a hang in the tests)
        self.w = weakref.proxy(window)
        window.rounds.round_selected.connect(self.round_selected)
        window.rounds.round_opened.connect(self.round_opened)
        window.output.token_clicked.connect(self.token_clicked)

    def round_selected(self, index: int) -> None:
        w = self.w
        w.selector_view.show_round(w.rounds_run, index)
        tabs = w.center_tabs
        if not switching(tabs) and tabs.currentWidget() is not w.selector_view:
            tabs.setCurrentWidget(w.output)
        w.output.highlight_round(index)

    def round_opened(self, _index: int) -> None:
        if not switching(self.w.center_tabs):
            self.w.center_tabs.setCurrentWidget(self.w.selector_view)

    def token_clicked(self, token_index: int) -> None:
        w = self.w
        run = w.output.run
        if run is None or run is not w.rounds_run:
            return
        tok = run.tokens[token_index]
        if tok.round is not None:
            w.rounds.select_round(tok.round)
            self.round_selected(tok.round)
