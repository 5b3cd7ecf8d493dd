"""Plain helpers for the window's tests (the fixtures are in conftest.py)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect

from app import screen_fit
from engine.decode.events import RoundEvent, SummaryEvent, TextEvent

RUN_TIMEOUT_MS = 60_000


def choose(window, dirs, prompt: str | None = None, **settings) -> None:
    """Pick a pair and (optionally) a raw prompt and settings, as a user would in the panels."""
    target, drafter = dirs
    window.models.target.set_value(str(target))
    window.models.drafter.set_value(str(drafter) if drafter else "")
    p = window.prompt
    if prompt is not None:
        p.set_prompt(prompt)
        p.format.setCurrentIndex(p.format.findData("raw"))
    for name, value in settings.items():
        if name == "mode":
            p.set_mode(value)
        elif isinstance(value, bool):
            getattr(p, name).setChecked(value)
        else:
            getattr(p, name).setValue(value)


def run_and_wait(qtbot, window, timeout: int = RUN_TIMEOUT_MS) -> None:
    with qtbot.waitSignal(window.run_finished, timeout=timeout):
        window.start_run()


def split_events(run):
    rounds = [e for e in run.events if isinstance(e, RoundEvent)]
    texts = [e for e in run.events if isinstance(e, TextEvent)]
    summary = next(e for e in run.events if isinstance(e, SummaryEvent))
    return rounds, texts, summary


def fake_screen(monkeypatch, available: QRect) -> None:
    monkeypatch.setattr(screen_fit, "available_geometry", lambda _window: QRect(available))


def run_button_on_screen(w, available: QRect) -> None:
    """Run lies inside the window's visible area, and the window inside the available area."""
    button = w.prompt.run_button
    assert button.isVisible() and not button.visibleRegion().isEmpty()
    where = QRect(button.mapTo(w, QPoint(0, 0)), button.size())
    assert w.rect().contains(where), (where, w.rect())
    assert available.contains(w.geometry()), (w.geometry(), available)
