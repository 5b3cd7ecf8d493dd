"""The window on small screens: a first launch fits the screen's available area, a restored
geometry larger than the screen is clamped, Run stays visible without scrolling, and below three
columns' width the plots become a tab instead of running past the window's edge."""

import os
import shutil
import subprocess
import sys

import pytest
from PySide6.QtCore import QRect, QSize
from PySide6.QtGui import QImage

from app import layout_fit, screen_fit, why_view
from app.layout_fit import plots_min_width
from app.screen_fit import clamp_geometry, first_geometry
from window_helpers import fake_screen, run_button_on_screen

SCREENS = {
    "1280x800": QRect(0, 0, 1280, 800),
    "macbook-13": QRect(0, 25, 1440, 875),  # 1440x900 less the menu bar
}


def test_first_geometry_keeps_the_preferred_size_on_a_large_screen():
    assert first_geometry(QRect(0, 0, 2560, 1440)).size() == screen_fit.PREFERRED
    small = first_geometry(QRect(0, 25, 1440, 875))
    assert QRect(0, 25, 1440, 875).contains(small) and small.width() == 1440 - 2 * screen_fit.MARGIN
    assert small.top() >= 25 + screen_fit.TITLE_BAR


def test_clamp_moves_and_shrinks_onto_the_screen():
    available = QRect(0, 0, 1280, 800)
    clamped = clamp_geometry(QRect(1500, -40, 1600, 1000), available)
    assert available.contains(clamped) and clamped.size() == QSize(1280, 800 - screen_fit.TITLE_BAR)
    inside = QRect(100, 100, 600, 500)
    assert clamp_geometry(inside, available) == inside


@pytest.mark.parametrize("screen", SCREENS)
def test_first_launch_fits_the_screen_and_run_is_visible(qtbot, make_window, monkeypatch, screen):
    available = SCREENS[screen]
    fake_screen(monkeypatch, available)
    w = make_window()
    qtbot.waitExposed(w)
    assert w.width() <= available.width() and w.height() <= available.height() - screen_fit.TITLE_BAR
    run_button_on_screen(w, available)


def test_a_restored_geometry_larger_than_the_screen_is_clamped(qtbot, make_window, monkeypatch):
    w = make_window()
    w.resize(1600, 1000)  # saved on a large monitor
    w.close()
    available = QRect(0, 0, 760, 700)  # smaller than the offscreen test screen, which Qt clamps to itself
    fake_screen(monkeypatch, available)
    w2 = make_window()
    qtbot.waitExposed(w2)
    run_button_on_screen(w2, available)


def columns_not_cut(w) -> None:
    """The settings column is as wide as its prompt grid needs, the plots as their titles and axes."""
    left = w.main_split.widget(0)
    assert left.width() >= left.minimumSizeHint().width(), (left.width(), left.minimumSizeHint())
    page = w.plots_page.viewport()  # the plots fill it, with no scroll bar across
    assert page.width() >= plots_min_width(w.plots) - 8, (page.width(), plots_min_width(w.plots))
    assert w.plots.width() == page.width(), (w.plots.width(), page.width())


def test_a_short_screen_scrolls_the_settings_and_plots_and_keeps_run_on_screen(qtbot, make_window, monkeypatch):
    """A 1280x800 laptop at 150% scaling has 853x533 logical pixels: the window once asked for 603 of
    height and ran off the screen, Run and the status bar with it, and its plots squashed flat."""
    available = QRect(0, 0, 853, 533)
    fake_screen(monkeypatch, available)
    w = make_window()
    qtbot.waitExposed(w)
    assert w.minimumSizeHint().height() <= available.height() - screen_fit.TITLE_BAR, w.minimumSizeHint()
    assert w.minimumSize().height() <= available.height() - screen_fit.TITLE_BAR
    run_button_on_screen(w, available)
    assert all(b.isVisible() and not b.visibleRegion().isEmpty() for b in w.prompt.mode_buttons.values())
    assert w.statusBar().isVisible() and w.statusBar().geometry().bottom() < w.height()
    scroll = w.prompt.editor.parentWidget()
    while not hasattr(scroll, "ensureWidgetVisible"):
        scroll = scroll.parentWidget()
    assert scroll.verticalScrollBar().maximum() > 0  # the settings scroll: they do not fit, nothing is cut
    scroll.ensureWidgetVisible(w.prompt.block_auto)
    qtbot.waitUntil(lambda: not w.prompt.block_auto.visibleRegion().isEmpty())
    w.center_tabs.setCurrentWidget(w.plots_page)
    qtbot.waitUntil(w.plots.isVisible)
    assert w.plots.height() >= layout_fit.PLOTS_MIN_HEIGHT  # readable, the page scrolls instead
    assert w.plots.width() >= plots_min_width(w.plots) - 8
    assert w.plots_page.verticalScrollBar().maximum() > 0 or w.plots_page.height() >= layout_fit.PLOTS_MIN_HEIGHT
    # The Why, Selector and Parity tabs scroll too, rather than print their axes over each other or
    # clip the parity verdict (a second QA pass at 125%)
    for view, least in ((w.why_view, why_view.WHY_PLOTS_HEIGHT), (w.parity_view, None)):
        w.center_tabs.setCurrentWidget(view)
        qtbot.waitUntil(view.isVisible)
        if least is not None:
            assert view.plots.height() >= least
        else:
            assert view.headline.height() >= view.headline.heightForWidth(view.headline.width())
            assert view.ar.height() >= view.ar.minimumHeight() > 0


@pytest.mark.parametrize("screen", SCREENS)
def test_at_laptop_sizes_no_tab_scrolls_that_need_not(qtbot, make_window, monkeypatch, screen):
    """The scroll areas are for short screens: at 1x on 1280x800 and 1440x900 no tab page scrolls."""
    from PySide6.QtWidgets import QScrollArea

    fake_screen(monkeypatch, SCREENS[screen])
    w = make_window()
    qtbot.waitExposed(w)
    for view in (w.output, w.parity_view, w.why_view, w.selector_view, w.race_view, w.plots_page):
        w.center_tabs.setCurrentWidget(view)
        qtbot.waitUntil(view.isVisible)
        area = view if isinstance(view, QScrollArea) else view.findChild(QScrollArea)
        if area is not None:
            assert area.verticalScrollBar().maximum() == 0, type(view).__name__
    scroll = w.prompt.editor.parentWidget()
    while not isinstance(scroll, QScrollArea):
        scroll = scroll.parentWidget()
    assert scroll.verticalScrollBar().maximum() == 0  # the settings fit (the prompt box takes what is left)


@pytest.mark.parametrize("screen", SCREENS)
def test_on_a_small_screen_the_plots_are_a_tab_and_nothing_is_cut(qtbot, make_window, monkeypatch, screen):
    fake_screen(monkeypatch, SCREENS[screen])
    w = make_window()
    qtbot.waitExposed(w)
    assert w.main_split.count() == 2 and w.center_tabs.indexOf(w.plots_page) >= 0
    assert not w.plots.isVisible()  # a tab page behind Output: never painted over it
    w.center_tabs.setCurrentWidget(w.plots_page)
    qtbot.waitUntil(w.plots.isVisible)
    columns_not_cut(w)
    assert w.center_tabs.height() > w.rounds.height()  # the plots get the larger share


def test_a_wide_window_has_three_columns_and_switches_back(qtbot, make_window):
    w = make_window()
    w.resize(1600, 1000)
    qtbot.waitUntil(lambda: w.main_split.count() == 3)
    assert w.center_tabs.indexOf(w.plots_page) < 0 and w.plots.isVisible()
    columns_not_cut(w)
    w.resize(1240, 760)
    qtbot.waitUntil(lambda: w.main_split.count() == 2)
    assert w.center_tabs.tabText(w.center_tabs.indexOf(w.plots_page)) == "Plots"
    w.close()
    w2 = make_window()  # reopens in the arrangement its size calls for, with that arrangement's sizes
    assert w2.main_split.count() == 2


@pytest.mark.skipif(shutil.which("xvfb-run") is None, reason="needs Xvfb (apt-get install xvfb)")
def test_screenshot_under_a_real_x_server_keeps_the_screens_size(tmp_path, monkeypatch):
    from app.qt_libs import xcb_problem

    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)  # as the window below starts: on xcb, not offscreen
    if xcb_problem():  # Xvfb without the xcb plugin's libraries (seen: xvfb installed, libxcb-icccm4 not)
        pytest.skip(xcb_problem())
    out = tmp_path / "small.png"
    env = dict(os.environ)
    proc = subprocess.run(["xvfb-run", "-a", "-s", "-screen 0 1280x800x24", sys.executable, "-m", "app.cli", "gui",
                           "--screenshot", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    image = QImage(str(out))
    assert 1000 <= image.width() <= 1280 and 600 <= image.height() <= 800 - screen_fit.TITLE_BAR
