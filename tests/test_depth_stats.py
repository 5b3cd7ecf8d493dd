"""Speed and acceptance by context depth: bins from events, bench's table, the Why tab's plots."""

from __future__ import annotations

import json

import pytest

from engine.decode.depth_stats import DepthStats, bin_label, bin_of, round_times, step_times
from engine.decode.events import RoundEvent, TextEvent


def _round(position: int, t: float, accepted: int, drafted: int = 3) -> RoundEvent:
    committed = list(range(accepted + 1))
    return RoundEvent(index=0, position=position, anchor=1, drafted=[5] * drafted, accepted=accepted, bonus=2,
                      bonus_kind="correction", committed=committed, draft_ms=1.0, verify_ms=2.0, rollback_ms=0.0,
                      t=t, generated=0)


def test_bins_cover_every_depth_once():
    assert [bin_of(d) for d in (0, 255, 256, 511, 512, 40_000)] == [0, 0, 1, 1, 2, 8]
    assert [bin_label(i) for i in (0, 1, 8)] == ["0-256", "256-512", "32768+"]


def test_rounds_and_steps_land_in_their_depths_with_their_wall_times():
    rounds = [_round(250, 0.010, 2), _round(253, 0.030, 0), _round(300, 0.045, 3, drafted=0)]
    assert round_times(rounds) == [(250, 0.010), (253, pytest.approx(0.020)), (300, pytest.approx(0.015))]
    texts = [TextEvent("a", [1], None, 0.0), TextEvent("b", [2], None, 0.004), TextEvent("", [], None, 0.004),
             TextEvent("c", [3], None, 0.010)]
    assert step_times(texts, 255) == [(256, 0.004), (257, pytest.approx(0.006))]
    stats = DepthStats()
    stats.add_rounds(rounds)
    stats.add_steps(step_times(texts, 255))
    shallow, deep = stats.rows()
    assert (shallow.label, shallow.rounds, shallow.drafting_rounds, shallow.tau, shallow.committed) == ("0-256", 2, 2, 2.0, 4)
    assert shallow.dflash_tok_s == pytest.approx(4 / 0.030, rel=1e-3) and shallow.ar_tok_s is None
    assert (deep.label, deep.rounds, deep.tau, deep.ar_tokens) == ("256-512", 1, None, 2)  # a plain step drafts nothing
    assert deep.ar_tok_s == pytest.approx(2 / 0.010, rel=1e-3)
    assert deep.speedup == pytest.approx((4 / 0.015) / (2 / 0.010), rel=1e-3)


def test_bench_reports_speed_by_depth_and_the_worst_prompt(qwen3_tied_dirs, tmp_path, capsys):
    from app.cli import main

    prompts = tmp_path / "prompts.jsonl"
    long_text = "def f(x):\n    return x + 1\n" * 40
    prompts.write_text(json.dumps({"prompt": "import json\n"}) + "\n" + json.dumps({"prompt": long_text}) + "\n")
    t, d = qwen3_tied_dirs
    assert main(["bench", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--max-tokens", "16",
                 "--raw", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    depths = [row["depth"] for row in result["by_depth"]]
    assert len(depths) >= 2 and depths[0] == "0-256"
    assert sum(row["rounds"] for row in result["by_depth"]) == result["rounds"]
    assert main(["bench", "--target", str(t), "--drafter", str(d), "--prompts", str(prompts), "--max-tokens", "16",
                 "--raw"]) == 0
    out = capsys.readouterr().out
    assert "by context depth" in out and "worst prompt:" in out and "prompts below AR" in out


def test_the_why_tab_plots_acceptance_and_cost_by_depth(qtbot, qwen3_pair):
    from engine.decode.prompts import encode_prompt
    from engine.decode.settings import GenerationSettings
    from engine.tools.parity import run_parity
    from app.run_record import RunRecord
    from app.why_view import WhyView

    view = WhyView()
    qtbot.addWidget(view)
    ids = encode_prompt(qwen3_pair.tokenizer, "def f(x):\n    return x + 1\n" * 30, chat=False)
    runs = {}
    events = []
    run_parity(qwen3_pair, ids, GenerationSettings(max_tokens=24), on_event=events.append)
    for e in events:
        if e.type == "start":
            runs[e.mode] = RunRecord(e, {}, None)
            current = runs[e.mode]
        elif e.type != "prefill":
            current.add(e)
    view.update_run(runs["dflash"], runs["ar"])
    x, y = view.depth_acc_dots.getData()
    assert list(x) == [r.position for r in runs["dflash"].rounds] and list(y) == [r.accepted + 1 for r in runs["dflash"].rounds]
    assert len(view.depth_cost_mean.getData()[0]) >= 1 and len(view.depth_ar_mean.getData()[0]) >= 1
    # every round of this run is in one depth range: its mean is one point, drawn as a marker among
    # the dots (a line through one point draws nothing, and the range's middle lay outside the dots)
    for mean in (view.depth_acc_mean, view.depth_cost_mean, view.depth_ar_mean):
        mx_, _ = mean.getData()
        assert len(mx_) == 1 and min(x) <= mx_[0] <= max(x) + 24
        assert mean.opts["symbol"] is not None
    legend = view.p_depth_cost.legend  # the cost plot says which colour is a round and which an AR step
    assert [label.text for _, label in legend.items] == ["a round", "round, mean", "AR step, mean"]
    # the legend's row sits above the highest point, not on it (it hid the top of the plot)
    costs = list(view.depth_cost_dots.getData()[1]) + list(view.depth_ar_mean.getData()[1])
    low, high = view.p_depth_cost.viewRange()[1]
    assert high >= max(costs) + 0.4 * (max(costs) - min(costs)) and low <= min(costs)
    # the grid never squeezes below its readable width (a narrow centre column clipped its right plot)
    assert view.plots.minimumWidth() >= 3 * 150
    view.update_run(None)
    assert len(view.depth_acc_dots.getData()[0] or []) == 0
