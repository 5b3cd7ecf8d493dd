"""Draft trees in the window (issue 55, section 4): the tree setting reaches the run and persists, a
tree round is marked in the rounds table and drawn in the Tree tab (the accepted path, the second
choices taken, the bonus), the Why tab shows where the tree paid, and a tree run's trace reopened
shows the same."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from app import theme
from app.settings import load_settings, settings_path
from engine.decode.events import RoundEvent, from_dict
from engine.decode.settings import TREE_BY_DEFAULT
from engine.decode.tree_stats import chain_depth, tree_nodes, tree_stats
from engine.models.demo import demo_pairs, sample_prompt

from helpers import PROMPTS
from window_helpers import choose, run_and_wait

V1 = next((t, d) for t, d in demo_pairs() if d.name == "demo-drafter")  # read before app_env hides the demo


def _tree_run(qtbot, w, dirs, prompt, **settings):
    choose(w, dirs, prompt, mode="dflash", block_auto=False, lookup=False, **settings)
    run_and_wait(qtbot, w)
    assert w.errors == []
    return w.rounds_run.rounds


def test_the_tree_setting_is_the_command_lines_default_reaches_the_run_and_persists(qtbot, make_window,
                                                                                      qwen3_tied_dirs):
    w = make_window()
    default_auto = TREE_BY_DEFAULT == "auto"
    assert w.prompt.tree_auto.isChecked() == default_auto and w.prompt.settings().tree_auto == default_auto
    assert w.prompt.tree.isEnabled() != default_auto  # auto sizes the tree: no budget to give
    rounds = _tree_run(qtbot, w, qwen3_tied_dirs, PROMPTS[0], max_tokens=24, block_size=4, tree_auto=False, tree=5)
    trees = [r for r in rounds if r.tree_parents]
    assert trees and all(1 < len(r.tree_parents) <= 6 for r in trees)  # 5 draft nodes and the anchor at most
    assert all(type(r.tree_parents) is list and type(r.tree_scores) is list for r in trees)  # plain data crossed
    w.tree_view.show_round(w.rounds_run, rounds.index(trees[0]))
    assert "At T > 0" not in w.tree_view.headline.text()
    rounds = _tree_run(qtbot, w, qwen3_tied_dirs, PROMPTS[0], temperature=1.0)  # sampled: the numbers are ranks'
    w.tree_view.show_round(w.rounds_run, next(i for i, r in enumerate(rounds) if r.tree_parents))
    assert "At T > 0" in w.tree_view.headline.text()
    w.prompt.temperature.setValue(0.0)
    rounds = _tree_run(qtbot, w, qwen3_tied_dirs, PROMPTS[0], max_tokens=24, block_size=4, tree=0)
    assert rounds and not any(r.tree_parents for r in rounds)  # "chain": no tree
    w.prompt.tree.setValue(7)
    w.save_settings()
    saved = json.loads(settings_path().read_text())
    assert (saved["tree"], saved["tree_auto"]) == (7, False)
    w2 = make_window()
    assert w2.prompt.tree.value() == 7 and not w2.prompt.tree_auto.isChecked() and w2.prompt.tree.isEnabled()
    settings_path().write_text(json.dumps({**saved, "tree": 999, "tree_auto": "yes"}))
    settings, notice = load_settings()
    assert (settings.tree, settings.tree_auto) == (0, TREE_BY_DEFAULT == "auto") and "tree, tree_auto" in notice


def _pick(qtbot, w, row: int) -> None:
    view = w.rounds
    view.scrollTo(view.rounds_model.index(row, 0))
    pos = view.visualRect(view.rounds_model.index(row, 0)).center()
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def _colour(image, x: int, y: int) -> str:
    return QColor(image.pixel(x, y)).name()


def assert_tree_drawn(qtbot, w, row: int) -> dict:
    """The Tree tab draws round `row` of the rounds table: every node and the bonus in its place and colour."""
    r = w.rounds_run.rounds[row]
    _pick(qtbot, w, row)
    assert w.center_tabs.currentWidget() is w.tree_view and w.tree_view.round_index == row
    canvas = w.tree_view.canvas
    nodes = tree_nodes(r)
    assert len(canvas.boxes) == len(nodes) + 1  # the bonus hangs off the path's end
    image = canvas.grab().toImage()
    ratio = image.devicePixelRatio()
    for n in nodes[1:]:
        box, style = canvas.boxes[n["node"]], canvas.styles[n["node"]]
        assert style == ("second" if n["accepted"] and n["rank"] > 0 else "accepted" if n["accepted"] else
                         "refused" if n["parent"] in r.tree_path else "unreached")
        inside = _colour(image, int((box.right() - 3) * ratio), int(box.center().y() * ratio))
        if style in ("accepted", "second"):
            assert inside == theme.CHIP_ACCEPTED
        if style == "second":  # the ring a second choice taken wears
            assert _colour(image, int(box.right() * ratio), int(box.center().y() * ratio)) == theme.CHIP_TREE
        if style == "refused":
            assert inside == theme.CHIP_REJECTED
        parent = canvas.boxes[n["parent"]]
        assert box.left() > parent.right() and box.top() >= parent.top()  # depth rightwards, ranks downwards
        if n["rank"] == 0:
            assert box.top() == parent.top()  # the chain, the first choices, is a straight line
    bonus = canvas.boxes[len(nodes)]
    assert canvas.styles[len(nodes)] == r.bonus_kind and bonus.left() > canvas.boxes[r.tree_path[-1]].right()
    fill = theme.CHIP_BONUS if r.bonus_kind == "bonus" else theme.CHIP_CORRECTION
    assert _colour(image, int((bonus.right() - 3) * ratio), int(bonus.center().y() * ratio)) == fill
    chain, exact = chain_depth(r)
    assert f"would have accepted {'' if exact else 'at least '}{chain}" in w.tree_view.headline.text()
    return {k: (v.getRect(), canvas.styles[k]) for k, v in canvas.boxes.items()}


def assert_why_shows(w) -> None:
    trees = w.why_view.trees
    stats = tree_stats(w.rounds_run.rounds)
    assert trees.isVisibleTo(w.why_view) and trees.stats == stats
    ranks = list(stats["by_rank"].values())
    assert list(trees.rank_bars.opts["height"]) == [a / j for a, j in ranks]
    tree_heights = trees.tree_bars.opts["height"]
    assert sum(tree_heights) == stats["tree_rounds"] and sum(trees.chain_bars.opts["height"]) == stats["tree_rounds"]
    assert f"{stats['mean_tree']:.2f} drafts a round" in trees.summary.text()


def test_a_tree_round_is_drawn_and_the_why_tab_shows_where_the_tree_paid(qtbot, make_window, tmp_path):
    """The demo v1 pair with a fixed tree of 15 takes second choices (tests/test_tree_rounds.py): the
    round that took one is drawn with it ringed on the accepted path; the trace of the run, reopened,
    draws the same and the Why tab counts the same."""
    w = make_window()
    target, drafter = V1
    rounds = _tree_run(qtbot, w, V1, sample_prompt(target), max_tokens=64, tree_auto=False, tree=15)
    row = next(i for i, r in enumerate(rounds) if any(r.tree_ranks[n] > 0 for n in r.tree_path))
    tip = w.rounds.rounds_model.data(w.rounds.rounds_model.index(row, 2), Qt.ItemDataRole.ToolTipRole)
    assert "a draft tree of 15 draft nodes" in tip and "second choice" in tip and "Tree tab" in tip
    drawn = assert_tree_drawn(qtbot, w, row)
    second = next(node for node, (_, style) in drawn.items() if style == "second")
    rank = rounds[row].tree_ranks[second]
    assert f"candidate #{rank + 1}" in w.tree_view.canvas.tip(second) and "second choice" in w.tree_view.canvas.tip(second)
    assert_why_shows(w)
    chain = next(i for i, r in enumerate(rounds) if not r.tree_parents) if not all(r.tree_parents for r in rounds) \
        else None
    if chain is not None:  # a round with no tree (a plain step) says so
        _pick(qtbot, w, chain)
        assert "verified a chain" in w.tree_view.headline.text() and not w.tree_view.canvas.boxes

    path = tmp_path / "tree-run.jsonl"
    assert w.export_trace(path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    written = [from_dict(rec) for rec in records if rec.get("type") == "round"]
    assert [r.tree_path for r in written] == [r.tree_path for r in rounds]
    w2 = make_window()
    assert w2.open_trace(path) and w2.errors == []
    assert w2.prompt.tree.value() == 15 and not w2.prompt.tree_auto.isChecked()  # the run's settings shown
    assert isinstance(w2.rounds_run.rounds[row], RoundEvent)
    assert assert_tree_drawn(qtbot, w2, row) == drawn
    assert_why_shows(w2)
