"""The issue's smaller items: the rounds table shows round 0 after a run, the prompt editor writes code in
a monospace font, and the Target "…" browser opens beside the current model's folder."""

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontInfo

from helpers import PROMPTS
from window_helpers import choose, run_and_wait


def test_after_a_run_the_rounds_table_shows_round_0(qtbot, make_window, qwen3_tied_dirs):
    """The table followed the newest rounds and hid round 0, while the Selector described "Round 0"."""
    w = make_window()
    w.resize(1280, 800)
    choose(w, qwen3_tied_dirs, PROMPTS[0], max_tokens=120, block_size=3, mode="dflash")
    run_and_wait(qtbot, w)
    table = w.rounds
    assert table.verticalScrollBar().maximum() > 0  # more rounds than the table shows at once
    assert table.rowAt(0) == 0
    assert w.selector_view.round_index in (None, 0)
    last = table.rounds_model.rowCount() - 1  # a round the user picked stays where they put it
    table.select_round(last)
    run_and_wait(qtbot, w)
    assert table.rowAt(0) == 0 or not table.currentIndex().isValid()


def test_the_prompt_editor_writes_in_the_outputs_monospace_font(qapp, make_window):
    from app.theme import apply_theme

    apply_theme(qapp)
    w = make_window()
    editor, output = w.prompt.editor, w.output
    editor.ensurePolished()
    output.ensurePolished()
    assert QFontInfo(editor.font()).fixedPitch()
    assert editor.font().family() == output.font().family()


def test_the_target_browser_opens_beside_the_current_model(qtbot, make_window, qwen3_tied_dirs, monkeypatch):
    from app import models_panel

    asked = []
    monkeypatch.setattr(models_panel.QFileDialog, "getExistingDirectory",
                        lambda parent, caption, start: asked.append(start) or "")
    w = make_window()
    target = qwen3_tied_dirs[0]
    w.models.target.set_value(str(target))
    qtbot.mouseClick(w.models.target.browse, Qt.MouseButton.LeftButton)
    assert asked == [str(target.parent)]
