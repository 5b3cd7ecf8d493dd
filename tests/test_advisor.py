"""The block-size advisor and `bench --block-sizes`: predictions from one run, beside measurements."""

from __future__ import annotations

import json

import pytest

from app.cli import main as cli
from engine.decode.advisor import acceptance_rates, advise, expected_committed
from engine.decode.cost_curve import CostCurve


def _curve(block: int = 4) -> CostCurve:
    return CostCurve(target="t", device="cpu", blas="-", block=block, repeats=1, ar_step_ms=10.0,
                     verify_ms=[10.0 + 2.0 * i for i in range(block)], draft_ms=4.0, measured_at=0.0,
                     draft_by_length_ms=[0.0] + [1.0 * i for i in range(1, block)])


def _round(accepted: int, drafted: int = 3) -> dict:
    return {"accepted": accepted, "drafted": [7] * drafted, "verified": drafted + 1}


def test_rates_count_only_the_drafts_a_round_reached():
    # half the rounds accept all three drafts, half reject the first: a_1 = 1/2, a_2 = a_3 = 1
    rounds = [_round(3), _round(0)] * 50
    rates = acceptance_rates(rounds, block=4)
    assert rates[0] == pytest.approx(0.5, abs=0.01)
    assert rates[1] == pytest.approx(1.0, abs=0.02) and rates[2] == pytest.approx(1.0, abs=0.02)
    assert expected_committed([0.5, 1.0, 1.0]) == [1.0, 1.5, 2.0, 2.5]


def test_predictions_use_the_curve_and_the_runs_own_overhead():
    rounds = [_round(3)] * 40  # every draft accepted: E(k) = k
    curve = _curve()
    decode_s = 40 * (curve.round_ms(4, whole_block=False) + 5.0) / 1000  # 5 ms per round beyond the curve
    advice = advise(rounds, decode_s, curve, ar_tok_s=100.0)
    assert advice.overhead_ms == pytest.approx(5.0)
    assert advice.committed == pytest.approx([1.0, 2.0, 3.0, 4.0], abs=0.1)  # the weak prior: 40.5/41
    for k in (1, 2, 3, 4):
        ms = curve.round_ms(k, whole_block=False) + 5.0
        assert advice.tok_s[k - 1] == pytest.approx(1000 * advice.committed[k - 1] / ms, rel=1e-3)
        assert advice.speedup_at(k) == pytest.approx(advice.tok_s[k - 1] / 100.0, rel=1e-3)
    assert advice.best == 4
    # auto drafts the whole block every round, so it can only cost more per round than the best fixed size
    assert advice.auto_speedup <= max(advice.speedup)
    assert advise([], 1.0, curve) is None


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


@pytest.mark.parametrize("sizes,message", [("2,x", "'x' is not a whole number"), ("0,4", "0 is outside"),
                                           ("auto", "at least one fixed size")])
def test_bad_block_sizes_are_one_line_before_loading(sizes, message, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a"}\n')
    code = cli(["bench", "--target", str(tmp_path / "missing"), "--prompts", str(prompts), "--block-sizes", sizes])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: block sizes:") and message in err and len(err.splitlines()) == 1
