"""The block-size advisor and `bench --block-sizes`: predictions from one run, beside measurements."""

from __future__ import annotations

import json

import pytest

from app.cli import main as cli
from engine.decode.advisor import advise, committed_per_round, streaks
from engine.decode.cost_curve_data import CostCurve


def _curve(block: int = 4) -> CostCurve:
    return CostCurve(target="t", device="cpu", blas="-", block=block, repeats=1, ar_step_ms=10.0,
                     verify_ms=[10.0 + 2.0 * i for i in range(block)], draft_ms=4.0, measured_at=0.0,
                     draft_by_length_ms=[0.0] + [1.0 * i for i in range(1, block)])


def _round(accepted: int, drafted: int = 3) -> dict:
    kind = "bonus" if accepted == drafted else "correction"
    return {"accepted": accepted, "drafted": [7] * drafted, "verified": drafted + 1, "bonus_kind": kind}


def test_streaks_replay_the_run_at_every_block_size():
    # a full block (3 drafts + bonus) carries its streak into the next round; a rejection ends it
    rounds = [_round(3), _round(1), _round(0), _round(2)]
    assert streaks(rounds) == [5, 0, 2]  # 4 + 1, then 0, then 2
    # block 2 commits a streak of 5 (6 tokens) in rounds of 2, 2, 2; a streak of 0 in one round
    assert committed_per_round([5], 2) == 2.0 and committed_per_round([0], 4) == 1.0
    assert committed_per_round([5, 0, 2], 4) == (6 + 1 + 3) / (2 + 1 + 1)
    assert committed_per_round([5, 0, 2], 1) == 1.0  # plain decoding: one token a round


def test_predictions_scale_the_curve_by_what_the_run_measured():
    curve = _curve()
    # every draft accepted; the run's drafts and verifies took twice the curve's time, plus 5 ms a round
    rounds = [dict(_round(3), draft_ms=2 * curve.draft_by_length_ms[3], verify_ms=2 * curve.verify_ms[3])] * 40
    per_round = 2 * curve.draft_by_length_ms[3] + 2 * curve.verify_ms[3] + 5.0
    advice = advise(rounds, 40 * per_round / 1000, curve, ar_tok_s=100.0)
    assert advice.overhead_ms == pytest.approx(5.0)
    assert advice.committed == pytest.approx([1.0, 2.0, 160 / 54, 4.0], abs=1e-3)  # one streak of 159
    for k in (1, 2, 3, 4):
        ms = 2 * curve.draft_by_length_ms[k - 1] + 2 * curve.verify_ms[k - 1] + 5.0
        assert advice.round_ms[k - 1] == pytest.approx(ms, rel=1e-3)
        assert advice.tok_s[k - 1] == pytest.approx(1000 * advice.committed[k - 1] / ms, rel=1e-3)
        assert advice.speedup_at(k) == pytest.approx(advice.tok_s[k - 1] / 100.0, rel=1e-3)
    assert advice.best == 4
    # auto drafts the whole block every round, so it can only cost more per round than the best fixed size
    assert advice.auto_speedup <= max(advice.speedup)
    assert advise([], 1.0, curve) is None


def test_rounds_that_verified_a_copy_say_nothing_about_the_drafter():
    """With --lookup a run's rounds mix the drafter's blocks and copies of the context (up to 32
    tokens): the advice, about the drafter and its block, is the drafter rounds' own, only the
    per-round overhead taken over every round."""
    curve = _curve()
    mine = [dict(_round(a), draft_ms=3.0, verify_ms=16.0, source="drafter") for a in (3, 1, 0, 2, 3, 0)]
    copy = dict(_round(20, drafted=24), draft_ms=0.0, verify_ms=40.0, source="lookup")
    mixed = mine[:2] + [copy] + mine[2:4] + [copy] + mine[4:]
    assert streaks(mixed) == streaks(mine) == [5, 0, 2, 4]
    # the same decode time per round: the overhead is what is left over every round
    alone = advise(mine, (6 * 19.0 + 6 * 5.0) / 1000, curve, ar_tok_s=100.0)
    both = advise(mixed, (6 * 19.0 + 2 * 40.0 + 8 * 5.0) / 1000, curve, ar_tok_s=100.0)
    assert both.overhead_ms == pytest.approx(5.0) and alone.overhead_ms == pytest.approx(5.0)
    assert both.committed == alone.committed and both.round_ms == pytest.approx(alone.round_ms)
    assert both.rounds == 6 and both.copies == 2 and alone.copies == 0
    assert advise([copy] * 3, 0.2, curve) is None  # copies alone (lookup mode): nothing to advise on
    # a streak open when a copy took over ends there, cut short as at a run's end: the drafter was
    # not asked during the copy, so its streak does not run on into the next drafter round
    assert streaks([_round(3), copy, copy, _round(1)]) == [3, 1]


def test_bench_block_sizes_measures_each_and_predicts_them(alternating_dirs, tmp_path, capsys):
    """The alternating oracle accepts exactly one draft per round at any block size: tau 2 everywhere,
    and the advisor, learning from the block-4 runs, predicts two tokens a round for 2..4."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a b"}\n{"prompt": "c d e"}\n')
    target, drafter = alternating_dirs
    code = cli(["bench", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                "--max-tokens", "12", "--block-sizes", "2,4,auto", "--raw", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["sizes"] == ["2", "4", "auto"] and result["advisor_source"] == 4
    for size in ("2", "4", "auto"):
        o = result["overall"][size]
        assert o["identical"] is True and o["speedup"] > 0 and o["predicted_speedup"] > 0
    assert result["overall"]["2"]["tau"] == pytest.approx(2.0) and result["overall"]["4"]["tau"] == pytest.approx(2.0)
    assert result["advice"]["committed"][1:] == pytest.approx([2.0, 2.0, 2.0], abs=0.05)
    assert set(result["per_prompt"][0]["speedup"]) == {"2", "4", "auto"}


def test_bench_block_sizes_warms_up_every_size(alternating_dirs, tmp_path, monkeypatch, capsys):
    """Each size verifies blocks of its own shapes, compiled on first use: each gets a warm-up, so
    no size's first prompt pays for compiling inside its timing."""
    from engine.tools import bench_sizes

    warmed = []
    real = bench_sizes.warm_up
    monkeypatch.setattr(bench_sizes, "warm_up", lambda pair, ids, ar, df, cancel: (
        warmed.append("auto" if df.auto else df.block_size), real(pair, ids, ar, df, cancel)))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a b"}\n')
    target, drafter = alternating_dirs
    assert cli(["bench", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                "--max-tokens", "8", "--block-sizes", "2,4,auto", "--raw"]) == 0
    assert warmed == [2, 4, "auto"]


def test_a_block_size_sweep_runs_the_drafter_alone():
    """Lookup is on by default, but a sweep of block sizes is about the drafter: every size, auto
    included, runs with lookup off."""
    from engine.decode.settings import GenerationSettings
    from engine.tools.bench_sizes import _settings_for

    settings = GenerationSettings(lookup=True, auto=True)
    for size in (2, 16, "auto"):
        assert _settings_for(settings, size).lookup is False


@pytest.mark.parametrize("sizes,message", [("2,x", "'x' is not a whole number"), ("0,4", "0 is outside"),
                                           ("auto", "at least one fixed size")])
def test_bad_block_sizes_are_one_line_before_loading(sizes, message, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n')
    code = cli(["bench", "--target", str(tmp_path / "missing"), "--prompts", str(prompts), "--block-sizes", sizes])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: block sizes:") and message in err and len(err.splitlines()) == 1
