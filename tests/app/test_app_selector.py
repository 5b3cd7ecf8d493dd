"""The Selector tab: a DFlash2 round's candidates per drafted position, the run's selector plots, and the
empty state for DFlash v1 runs and old traces."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import Qt

from engine.decode.selector_stats import positions, selector_stats
from app.rounds_view import round_tooltip
from app.selector_view import FIXED, MARKS_ROLE, V1
from app.tokens import chip_text
from helpers import PROMPTS
from fixtures.tiny_dflash2 import write_dflash2_drafter
from window_helpers import choose, run_and_wait


@pytest.fixture(scope="module")
def dflash2_dirs(qwen3_untied_dirs, tmp_path_factory):
    target = qwen3_untied_dirs[0]
    return target, write_dflash2_drafter(tmp_path_factory.mktemp("dflash2-app") / "drafter", target, seed=5)


def _double_click_row(qtbot, view, row: int) -> None:
    rect = view.visualRect(view.model().index(row, 0))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def test_a_dflash2_round_lists_its_candidates_and_the_targets_rank(qtbot, make_window, dflash2_dirs):
    w = make_window()
    # a chain: a tree round's double-click opens the Tree tab
    choose(w, dflash2_dirs, PROMPTS[0], max_tokens=32, block_size=6, block_auto=False, tree_auto=False)
    run_and_wait(qtbot, w)
    assert w.errors == []
    assert "DFlash2 drafter" in w.models.status.text()  # the loaded pair names its drafter's generation
    run, view = w.rounds_run, w.selector_view
    assert not view.body.isHidden() and view.empty.isHidden()
    broke = next(i for i, r in enumerate(run.rounds) if r.accepted < len(r.drafted))
    r = run.rounds[broke]

    _double_click_row(qtbot, w.rounds, broke)  # open the round: the Selector tab shows it
    assert w.center_tabs.currentWidget() is view
    table, k = view.table, len(r.candidates[0])
    assert table.rowCount() == len(r.drafted) and table.columnCount() == len(FIXED) + k
    for i, (ids, scores) in enumerate(zip(r.candidates, r.candidate_scores)):
        for c, (token, score) in enumerate(zip(ids, scores)):
            assert table.item(i, len(FIXED) + c).text() == f"{chip_text(run.table, token, 10)} {score:.1f}"
        # the selector's path: at T=0 the best-scored candidate, marked drafted
        assert "drafted" in table.item(i, len(FIXED)).data(MARKS_ROLE) and r.drafted[i] == ids[0]
        rank = r.target_candidate_rank[i]
        if rank >= 0:
            assert table.item(i, 2).text() == f"#{rank + 1}"
            assert "target" in table.item(i, len(FIXED) + rank).data(MARKS_ROLE)
        else:
            assert table.item(i, 2).text() == "not a candidate"
            assert not any("target" in table.item(i, len(FIXED) + c).data(MARKS_ROLE) for c in range(k))
        plain = table.item(i, 3).text()
        assert (plain == "= drafted") == (r.plain_top[i] == r.drafted[i])
        assert [table.item(i, len(FIXED) + c).data(MARKS_ROLE).count("plain") for c in range(k)].count(1) == 1
    assert table.item(r.accepted, 1).text() == "rejected"
    assert f"draft {r.accepted + 1} broke" in view.round_label.text()
    assert "selector:" in round_tooltip(r, run.table)

    # With the Selector tab open, picking another round keeps the tab and shows that round.
    other = (broke + 1) % len(run.rounds)
    w.rounds.selectRow(other)
    assert w.center_tabs.currentWidget() is view and view.round_index == other
    assert table.rowCount() == len(positions(run.rounds[other]))


def test_the_selector_plots_hold_the_runs_stats(qtbot, make_window, dflash2_dirs):
    w = make_window()
    choose(w, dflash2_dirs, PROMPTS[1], max_tokens=32, block_size=6, block_auto=False)
    run_and_wait(qtbot, w)
    stats = selector_stats(w.rounds_run.rounds)
    judged = stats["judged"]
    assert judged > 0 and stats["rescored"] > 0  # the random selector does rescore the head's argmax
    series = w.selector_view.series()
    assert np.allclose(series["rank"], np.asarray(stats["rank_counts"]) / judged)
    assert np.allclose(series["not_candidate"], [stats["not_candidate"] / judged])
    assert np.allclose(series["accepted"], np.asarray([stats["kept_accepted"], stats["rescored_accepted"]]) / judged)
    assert np.allclose(series["argmax right"], [0, stats["rescored_plain_was_target"] / judged])
    stacked = series["accepted"] + series["argmax right"] + series["rejected"]
    assert np.allclose(stacked, np.asarray([stats["kept"], stats["rescored"]]) / judged)
    assert f"{judged} judged drafts" in w.selector_view.summary.text()


def test_v1_runs_and_old_traces_show_the_empty_state(qtbot, make_window, alternating_dirs, tmp_path):
    w = make_window()
    choose(w, alternating_dirs, PROMPTS[0], max_tokens=12, block_size=4, block_auto=False, tree_auto=False)
    run_and_wait(qtbot, w)
    view = w.selector_view
    assert view.empty.text() == V1 and not view.empty.isHidden() and view.body.isHidden()
    _double_click_row(qtbot, w.rounds, 1)
    assert w.center_tabs.currentWidget() is view and w.errors == []
    assert view.empty.text() == V1 and view.table.rowCount() == 0

    # A trace written before DFlash2: no generation in its header, no selector fields in its rounds.
    path = tmp_path / "v1.jsonl"
    assert w.export_trace(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["model"].pop("drafter_generation", None)
    for rec in lines[1:]:
        for name in ("candidates", "candidate_scores", "target_candidate_rank", "plain_top"):
            rec.pop(name, None)
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    w2 = make_window()
    assert w2.open_trace(path)
    assert w2.selector_view.empty.text() == V1 and w2.selector_view.body.isHidden()
    w2.rounds.selectRow(0)
    assert w2.errors == [] and w2.selector_view.table.rowCount() == 0
