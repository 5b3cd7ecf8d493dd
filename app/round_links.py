"""Rounds <-> output, selector and tree: a round picked in the table, or a token clicked in the output, is
shown in the output (highlighted), described in the Selector and, a tree round, drawn in the Tree tab.

A pick brings the Output page forward (the Selector or the Tree stays when it is on show; a double-click
opens the Tree for a tree round, the Selector for any other), but never while the
tab bar is switching pages: hiding a page hands the keyboard focus on, and a table with no current
row takes its first row when it gets the focus.
"""

from __future__ import annotations

import weakref

from PySide6.QtWidgets import QTabWidget

from engine.decode.tree_stats import is_tree_round


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
        w.tree_view.show_round(w.rounds_run, index)
        tabs = w.center_tabs
        if not switching(tabs) and tabs.currentWidget() not in (w.selector_view, w.tree_view):
            tabs.setCurrentWidget(w.output)
        w.output.highlight_round(index)

    def round_opened(self, index: int) -> None:
        """A tree round opens in the Tree tab, any other in the Selector."""
        w = self.w
        r = w.rounds.rounds_model.round_at(index)
        if not switching(w.center_tabs):
            w.center_tabs.setCurrentWidget(w.tree_view if r is not None and is_tree_round(r) else w.selector_view)

    def token_clicked(self, token_index: int) -> None:
        w = self.w
        run = w.output.run
        if run is None or run is not w.rounds_run:
            return
        tok = run.tokens[token_index]
        if tok.round is not None:
            w.rounds.select_round(tok.round)
            self.round_selected(tok.round)
