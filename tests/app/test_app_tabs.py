"""The tab bar tells the truth: the page on show is the tab highlighted, whatever the rounds table does
while the user switches tabs."""

import pytest
from PySide6.QtCore import Qt

from helpers import PROMPTS


@pytest.fixture(scope="module")
def dflash_trace(qwen3_tied_dirs, tmp_path_factory):
    """A DFlash run's trace, written by the command line."""
    from app.cli import main as cli

    path = tmp_path_factory.mktemp("tabs") / "run.jsonl"
    target, drafter = qwen3_tied_dirs
    assert cli(["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", PROMPTS[0], "--raw",
                "--max-tokens", "24", "--block-size", "4", "--mode", "dflash", "--trace", str(path)]) == 0
    return path


def click_tab(qtbot, tabs, widget) -> None:
    bar = tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(tabs.indexOf(widget)).center())


def assert_on_show(tabs, widget) -> None:
    """The tab highlighted and the page on show are both `widget`."""
    assert tabs.tabBar().currentIndex() == tabs.indexOf(widget)
    assert tabs.currentWidget() is widget and widget.isVisible()


def test_switching_tabs_with_the_focus_in_the_output_never_lands_on_another_tab(qtbot, make_window, dflash_trace):
    """Focus in the output text, open a trace, then Why and Selector: hiding the Why page (its scroll area
    had the focus) moved the focus to the rounds table, whose first row became current, and selecting that
    round moved the tab to Output in the middle of the switch to Selector."""
    w = make_window()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    tabs = w.center_tabs
    tabs.setCurrentWidget(w.output)
    w.output.setFocus()
    qtbot.waitUntil(w.output.hasFocus)
    assert w.open_trace(dflash_trace)
    for page in (w.why_view, w.selector_view, w.output, w.why_view, w.race_view):
        click_tab(qtbot, tabs, page)
        assert_on_show(tabs, page)


def test_a_round_picked_in_the_table_shows_it_in_the_output_or_the_selector(qtbot, make_window, dflash_trace):
    """What selecting a round is for: from another tab it brings the output (the round highlighted), and
    with the Selector on show it stays there, describing that round."""
    w = make_window()
    assert w.open_trace(dflash_trace)
    tabs = w.center_tabs
    tabs.setCurrentWidget(w.why_view)
    row = w.rounds.visualRect(w.rounds.rounds_model.index(1, 0)).center()
    qtbot.mouseClick(w.rounds.viewport(), Qt.MouseButton.LeftButton, pos=row)
    assert_on_show(tabs, w.output)
    tabs.setCurrentWidget(w.selector_view)
    row = w.rounds.visualRect(w.rounds.rounds_model.index(2, 0)).center()
    qtbot.mouseClick(w.rounds.viewport(), Qt.MouseButton.LeftButton, pos=row)
    assert_on_show(tabs, w.selector_view)
    assert w.selector_view.round_index == 2
