"""The window on small screens: a first launch fits the screen's available area, a restored
geometry larger than the screen is clamped, and Run stays visible without scrolling."""

import pytest
from PySide6.QtCore import QPoint, QRect, QSize

from app import screen_fit
from app.screen_fit import clamp_geometry, first_geometry

from test_app_common import app_env, make_window  # noqa: F401

SCREENS = {
    "1280x800": QRect(0, 0, 1280, 800),
    "macbook-13": QRect(0, 25, 1440, 875),  # 1440x900 less the menu bar
}


def fake_screen(monkeypatch, available: QRect) -> None:
    monkeypatch.setattr(screen_fit, "available_geometry", lambda _window: QRect(available))


def run_button_on_screen(w, available: QRect) -> None:
    """Run lies inside the window's visible area, and the window inside the available area."""
    button = w.prompt.run_button
    assert button.isVisible() and not button.visibleRegion().isEmpty()
    where = QRect(button.mapTo(w, QPoint(0, 0)), button.size())
    assert w.rect().contains(where), (where, w.rect())
    assert available.contains(w.geometry()), (w.geometry(), available)


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
