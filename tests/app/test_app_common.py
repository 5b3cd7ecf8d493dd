"""Shared fixtures and helpers for the window's tests (imported by tests/test_app_*.py)."""

from __future__ import annotations

import pytest

from engine.decode.events import RoundEvent, SummaryEvent, TextEvent

RUN_TIMEOUT_MS = 60_000


@pytest.fixture(autouse=True)
def app_env(tmp_path, monkeypatch):
    """Every window test gets its own settings, logs, HF cache and (absent) demo pair."""
    monkeypatch.setenv("DFLASH_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("DFLASH_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("DFLASH_MODELS_DIR", str(tmp_path / "no-demo-models"))
    return tmp_path


@pytest.fixture
def make_window(qtbot):
    """A factory of shown windows, each closed (worker stopped) at the end of the test."""
    from app.window import MainWindow

    made = []

    def make(**kwargs):
        w = MainWindow(**kwargs)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()
        assert w.host.thread.isFinished()


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
