"""Typed numbers out of range are clamped with a notice saying from what, and max tokens is bounded by the
loaded target's context (it took 999999 beside a 2,048-token context, refused only at Run)."""

import pytest
from PySide6.QtCore import Qt

from engine.decode.settings import MAX_BLOCK

from window_helpers import choose


def type_into(qtbot, box, text):
    box.setFocus()
    box.lineEdit().selectAll()
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key.Key_Return)


@pytest.mark.parametrize("name, typed, value, said", [
    ("max_tokens", "0", 1, "max tokens 0 is below 1: set to 1."),
    ("block_size", "999", MAX_BLOCK, f"block size 999 is above {MAX_BLOCK}: set to {MAX_BLOCK}."),
    ("top_p", "5", 1.0, "top-p 5.00 is above 1.00: set to 1.00."),
])
def test_a_typed_number_out_of_range_is_clamped_with_a_notice(qtbot, make_window, name, typed, value, said):
    """Max tokens "0" came back as 128 on Tab, and block size "999" became 9 (the last keystroke dropped)."""
    w = make_window()
    box = getattr(w.prompt, name)
    type_into(qtbot, box, typed)
    assert box.value() == value and w.notices[-1] == said


def test_a_typed_number_in_range_says_nothing(qtbot, make_window):
    w = make_window()
    type_into(qtbot, w.prompt.block_size, "12")
    assert w.prompt.block_size.value() == 12 and w.notices == []


def test_max_tokens_ranges_up_to_the_loaded_targets_context(qtbot, make_window, qwen3_tied_dirs):
    w = make_window()
    choose(w, qwen3_tied_dirs, "print('hello')", max_tokens=999_999)
    with qtbot.waitSignal(w.load_finished, timeout=30_000):
        w.start_load()
    box = w.prompt.max_tokens
    assert box.maximum() == box.value() == 4096  # the fixtures' max_position_embeddings
    assert "max tokens 999,999 is more than this target's 4,096-token context allows: set to 4,096." in w.notices
    type_into(qtbot, box, "5000")
    assert box.value() == 4096 and w.notices[-1] == ("max tokens 5,000 is more than this target's 4,096-token "
                                                     "context allows: set to 4,096.")
