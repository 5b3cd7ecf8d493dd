"""The cost curve: measured once per target and machine, cached, and printed by `calibrate`."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from app.cli import main as cli
from engine.decode import cost_curve as cc
from engine.models import kernel_dispatch
from kernels import verify_attention

pytestmark = pytest.mark.measures_cost_curve  # the cost curve's own tests time it


def test_measure_covers_every_verify_length(qwen3_pair):
    curve = cc.measure(qwen3_pair, block=4, repeats=1)
    assert curve.block == 4 and len(curve.verify_ms) == 4 and len(curve.verify_in_ar_steps()) == 4
    assert curve.ar_step_ms > 0 and all(v > 0 for v in curve.verify_ms) and curve.draft_ms > 0
    assert curve.round_ms(1) == curve.verify_ms[0]  # a block of one drafts nothing
    assert curve.round_ms(4) == curve.verify_ms[3] + curve.draft_ms
    # a fixed block size drafts only its own length: one draft time per length
    assert len(curve.draft_by_length_ms) == 4 and curve.draft_by_length_ms[0] == 0
    assert all(d > 0 for d in curve.draft_by_length_ms[1:]) and curve.draft_by_length_ms[3] == curve.draft_ms
    assert curve.round_ms(2, whole_block=False) == curve.verify_ms[1] + curve.draft_by_length_ms[1]


def test_the_curve_is_cached_per_target_and_block(qwen3_pair, monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    first, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)
    assert not cached
    calls = []
    real = cc.measure_steps
    monkeypatch.setattr(cc, "measure_steps", lambda *a, **k: calls.append(k) or real(*a, **k))
    again, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)
    assert cached and again == first and calls == []
    _, cached = cc.cost_curve(qwen3_pair, block=4, repeats=1)  # a longer block: another entry (a shorter reuses it)
    assert not cached and len(calls) == 1
    _, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1, fresh=True)
    assert not cached and len(calls) == 2
    for entry in (tmp_path / "cost-curves").glob("*.json"):  # a draft list of the wrong length: again
        data = json.loads(entry.read_text())
        entry.write_text(json.dumps({**data, "draft_by_length_ms": data["draft_by_length_ms"][:-1]}))
    _, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)
    assert not cached and len(calls) == 3
    for entry in (tmp_path / "cost-curves").glob("*.json"):  # a damaged entry is measured again
        entry.write_text("[" * 10_000)
    _, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)
    assert not cached and len(calls) == 4


def test_a_curve_timed_through_other_kernels_is_not_reused(qwen3_pair, monkeypatch, tmp_path):
    """Our CPU kernels change what a verify row costs: a curve timed through other kernels (none, as
    DFLASH_NO_CPU_KERNELS loads a pair; other attention thresholds; an older revision of them) would
    price rows wrongly, so it is measured again."""
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    assert qwen3_pair.cpu_kernels  # loaded on the CPU: the kernels run
    assert not cc.cost_curve(qwen3_pair, block=3, repeats=1)[1]
    assert cc.cost_curve(qwen3_pair, block=3, repeats=1)[1]
    assert not cc.cost_curve(replace(qwen3_pair, cpu_kernels=()), block=3, repeats=1)[1]
    monkeypatch.setattr(verify_attention, "MIN_GRAPH_SCORES", verify_attention.MIN_GRAPH_SCORES * 2)
    assert not cc.cost_curve(qwen3_pair, block=3, repeats=1)[1]
    monkeypatch.setattr(kernel_dispatch, "KERNELS_REVISION", kernel_dispatch.KERNELS_REVISION + 1)
    assert not cc.cost_curve(qwen3_pair, block=3, repeats=1)[1]
    assert len(list((tmp_path / "cost-curves").glob("*.json"))) == 4


def test_a_sampled_run_prices_its_draws(qwen3_pair, monkeypatch, tmp_path):
    """At T > 0 an AR step draws its token, a verify accepts its drafts and a draft draws them as
    the run would (a draw over a 152k vocabulary costs as much as a small model's forward): each
    kind of sampling has its own cached curve, which times those draws."""
    from engine.decode.settings import SamplingSettings

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS,))
    sampled, top_k = SamplingSettings(temperature=0.7, seed=1), SamplingSettings(temperature=0.7, top_k=5)
    assert [cc.sampling_kind(s) for s in (None, SamplingSettings(), sampled, top_k)] == \
        ["greedy", "greedy", "sampled", "top-k"]
    assert cc.sampling_kind(SamplingSettings(temperature=0.7, top_p=0.9)) == "top-p"
    assert cc.sampling_kind(SamplingSettings(temperature=0.7, top_p=0.9, top_k=20)) == "top-k+top-p"
    draws = {"sample": 0, "accept": 0, "draft": 0}  # draws at T > 0 (a greedy curve's argmaxes aside)

    def spy(name, real):
        def counted(*a):
            sampler = a[0]
            draws[name] += not sampler.s.greedy
            return real(*a)
        return counted

    monkeypatch.setattr(cc, "accept", spy("accept", cc.accept))
    monkeypatch.setattr(cc.Sampler, "sample", spy("sample", cc.Sampler.sample))
    monkeypatch.setattr(cc.Sampler, "draft", spy("draft", cc.Sampler.draft))
    greedy, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)
    assert not cached and greedy.sampling == "greedy" and draws == {"sample": 0, "accept": 0, "draft": 0}
    curve, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1, sampling=sampled)
    assert not cached and curve.sampling == "sampled"  # not the greedy curve
    # every sweep: one AR step and one verify per length (and the warm-up's), a draft per length past 1
    assert draws["sample"] >= 3 and draws["accept"] >= 4
    assert draws["draft"] >= 2  # the v1 drafter draws its drafts from q
    assert cc.cost_curve(qwen3_pair, block=3, repeats=1, sampling=replace(sampled, seed=9))[1]  # a seed: same
    assert not cc.cost_curve(qwen3_pair, block=3, repeats=1, sampling=top_k)[1]


def test_calibrate_command(qwen3_tied_dirs, capsys):
    t, d = qwen3_tied_dirs
    assert cli(["calibrate", "--target", str(t), "--drafter", str(d), "--block-size", "3", "--repeats", "1",
                "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["block"] == 3 and len(out["verify_ms"]) == 3 and len(out["verify_in_ar_steps"]) == 3
    assert cli(["calibrate", "--target", str(t), "--drafter", str(d), "--block-size", "3", "--repeats", "1"]) == 0
    text = capsys.readouterr().out
    assert "cached" in text and "AR step" in text
    assert cli(["calibrate", "--target", str(t), "--drafter", str(d), "--repeats", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: repeats 0") and len(err.splitlines()) == 1
    # auto: the curve --block-size auto runs use, up to the drafter's own block (was an argparse error)
    assert cli(["calibrate", "--target", str(t), "--drafter", str(d), "--repeats", "1", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert cli(["calibrate", "--target", str(t), "--drafter", str(d), "--block-size", "auto", "--repeats", "1",
                "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto["block"] == default["block"] == len(auto["verify_ms"]) > 3 and auto["cached"]
    # without a drafter no run uses auto (lookup and AR have no verify length to choose): said, not measured
    assert cli(["calibrate", "--target", str(t), "--block-size", "auto", "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "without a drafter no run uses it" in err and len(err.splitlines()) == 1


def test_more_sweeps_take_the_repeats_then_what_fits_in_the_budget():
    assert cc.more_sweeps(0, 3, 0.0, 0.0) and cc.more_sweeps(2, 3, 99.0, 0.0)  # the repeats asked for, always
    assert not cc.more_sweeps(3, 3, 0.3, 0.0)  # no budget: the repeats only
    assert cc.more_sweeps(3, 3, 3.0, 4.0)  # three sweeps in 3 s: a fourth ends at 4 s, within 4 s
    assert not cc.more_sweeps(3, 3, 3.3, 4.0)  # ...but not at 4.4 s
    assert cc.more_sweeps(8, 3, 0.8, 100.0) and not cc.more_sweeps(9, 3, 0.9, 100.0)  # at most 3 x repeats


def test_sweeps_past_the_repeats_are_counted_and_progress_jumps_a_depth_that_ends_early(qwen3_pair, monkeypatch):
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    steps = cc.measure_steps(qwen3_pair, block=3, repeats=2, budget_s=0.0)
    seen = []
    while True:
        try:
            seen.append(next(steps))
        except StopIteration as stop:
            curve = stop.value
            break
    most = cc.EXTRA_SWEEPS * 2
    assert seen == [(1, 2 * most), (2, 2 * most), (most, 2 * most), (most + 1, 2 * most), (most + 2, 2 * most),
                    (2 * most, 2 * most)]
    assert [p.sweeps for p in curve.points()] == [2, 2] and curve.repeats == 2
    roomy = cc.measure(qwen3_pair, block=3, repeats=2, budget_s=1e9)  # a tiny model: every extra sweep fits
    assert [p.sweeps for p in roomy.points()] == [most, most]


@pytest.mark.parametrize("block", [0, 65])
def test_absurd_blocks_are_refused(qwen3_pair, block):
    from engine.errors import DFlashError

    with pytest.raises(DFlashError, match="1..64"):
        cc.measure(qwen3_pair, block=block or -1, repeats=1)


def _deep_curve(block: int = 4) -> cc.CostCurve:
    """Verifies that cost ~L AR steps' attention more at depth: cheap at 32, dear at 1,024."""
    return cc.CostCurve(
        target="t", device="cpu", blas="-", block=block, repeats=1, ar_step_ms=10.0,
        verify_ms=[10.0 + n for n in range(block)], draft_ms=2.0, measured_at=0.0,
        draft_by_length_ms=[0.0] + [2.0] * (block - 1),
        deeper=[cc.DepthPoint(512, 12.0, [12.0 + 4 * n for n in range(block)], [0.0] + [2.0] * (block - 1)),
                cc.DepthPoint(1024, 14.0, [14.0 + 8 * n for n in range(block)], [0.0] + [3.0] * (block - 1))])


def test_the_curve_at_a_depth_interpolates_between_depths_and_extends_past_the_deepest():
    curve = _deep_curve()
    assert curve.at(0).verify_ms == curve.verify_ms == curve.at(32).verify_ms
    mid = curve.at(768)  # halfway between 512 and 1,024
    assert mid.ar_step_ms == 13.0 and mid.verify_ms == [13.0, 19.0, 25.0, 31.0] and mid.context == 768
    assert mid.draft_by_length_ms == [0.0, 2.5, 2.5, 2.5] and mid.draft_ms == 2.5
    assert curve.at(1024).verify_ms == curve.deeper[-1].verify_ms
    past = curve.at(1536)  # along the 512..1,024 segment
    assert past.verify_ms == [16.0, 28.0, 40.0, 52.0] and past.ar_step_ms == 16.0
    assert curve.at(272).verify_ms == [11.0, 13.5, 16.0, 18.5]  # between the base (32) and 512
    falling = cc.CostCurve(**{**curve.__dict__, "deeper": [cc.DepthPoint(512, 9.0, [9.0] * 4, None)]})
    assert falling.at(4096).ar_step_ms == 9.0  # a noisy fall is never extended below the deepest point


def test_measure_covers_the_depths_the_target_holds(qwen3_pair, monkeypatch):
    from engine.decode import prefill

    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64, 100_000))
    curve = cc.measure(qwen3_pair, block=3, repeats=1)
    limit = prefill.context_length(qwen3_pair)
    assert [p.depth for p in curve.points()] == [cc.CONTEXT_TOKENS, 64] and limit < 100_000
    deep = curve.deeper[0]
    assert len(deep.verify_ms) == 3 and all(v > 0 for v in deep.verify_ms) and deep.ar_step_ms > 0
    assert deep.draft_by_length_ms[0] == 0 and all(d > 0 for d in deep.draft_by_length_ms[1:])
    assert deep.verify_ms == sorted(deep.verify_ms)  # fitted at every depth


def test_a_cached_curve_keeps_its_depths_and_window(qwen3_pair, monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    first, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1, window=8, sink=2)
    again, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1, window=8, sink=2)
    assert cached and again == first and again.deeper and (again.draft_window, again.draft_sink) == (8, 2)
    _, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)  # another drafter context: another entry
    assert not cached


def test_auto_prices_a_round_at_the_runs_depth():
    """Shallow, a long verify costs little more than a short one and the whole block pays; deep,
    where a verify's attention costs L times a step's, a drafter right 60% of the time is worth
    a short block only."""
    from engine.decode.verify_length import VerifyLengthController

    curve = _deep_curve(block=8)
    c = VerifyLengthController(curve, 8)
    for _ in range(40):
        c.record(7, 3)  # three of seven drafts accepted each round
    assert c.best(depth=32) > c.best(depth=4096) >= 1


def test_auto_measures_the_curve_inside_the_run_with_progress_and_stop_is_a_notice(qwen3_pair, monkeypatch, tmp_path):
    """The first auto run measures the curve as part of the run: progress events while it does, and a
    Stop there ends the run as cancelled (no error); the next run measures it again and uses it."""
    from engine.decode.generate import generate
    from engine.decode.events import CalibrationEvent, SummaryEvent
    from engine.decode.settings import GenerationSettings

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))

    class StopAfter:
        def __init__(self, reads):
            self.reads = reads

        @property
        def cancelled(self):
            self.reads -= 1
            return self.reads < 0

        def cancel(self):
            pass

    settings = GenerationSettings(max_tokens=8, auto=True, block_size=4)
    events = list(generate(qwen3_pair, [5, 6, 7], settings, StopAfter(5)))
    assert isinstance(events[-1], SummaryEvent) and events[-1].stop_reason == "cancelled"
    assert events[-1].num_generated == 0
    assert not list(tmp_path.rglob("*.json"))  # nothing cached from a stopped measurement
    events = list(generate(qwen3_pair, [5, 6, 7], settings))
    progress = [e for e in events if isinstance(e, CalibrationEvent)]
    # 2 depths x up to 9 sweeps (3 repeats, more while they fit in the budget): counts rise to the end
    assert [e.total for e in progress] == [2 * cc.EXTRA_SWEEPS * 3] * len(progress)
    assert [e.done for e in progress] == sorted({e.done for e in progress}) and progress[-1].done == progress[-1].total
    assert events[-1].num_generated == 8
    again = list(generate(qwen3_pair, [5, 6, 7], settings))
    assert not any(isinstance(e, CalibrationEvent) for e in again)  # cached now


def test_a_stopped_measurement_goes_on_from_the_depths_it_finished(qwen3_pair, monkeypatch, tmp_path):
    """Stop during the cost curve's measurement, then Run again: the depths already measured are kept
    (the measurement started again from its first step, and a long prompt's first run spends most of
    its time there; QA pass). The curve is whole, and cached, in the end."""
    from engine.decode.cancel import CancelToken
    from engine.decode.generate import generate
    from engine.decode.events import CalibrationEvent
    from engine.decode.settings import GenerationSettings

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    measured = []
    real = cc._measure_depth
    monkeypatch.setattr(cc, "_measure_depth", lambda pair, depth, *a: (measured.append(depth), real(pair, depth, *a))[1])
    settings = GenerationSettings(max_tokens=8, auto=True, block_size=4)
    per_depth = cc.EXTRA_SWEEPS * 3
    token = CancelToken()
    for event in generate(qwen3_pair, [5, 6, 7], settings, token):
        if isinstance(event, CalibrationEvent) and event.done >= per_depth:
            token.cancel()  # the first depth is measured: Stop
    assert measured == [cc.CONTEXT_TOKENS, 64] and not list(tmp_path.rglob("*.json"))
    measured.clear()
    events = list(generate(qwen3_pair, [5, 6, 7], settings))
    progress = [e.done for e in events if isinstance(e, CalibrationEvent)]
    assert measured == [64] and progress[0] > per_depth and progress[-1] == 2 * per_depth  # went on
    assert events[-1].num_generated == 8 and len(list(tmp_path.rglob("*.json"))) == 1
    (saved,) = tmp_path.rglob("*.json")
    curve = cc._from_json(json.loads(saved.read_text()))
    assert [p.depth for p in curve.points()] == [cc.CONTEXT_TOKENS, 64] and cc._sound(curve, 4)


def test_the_cli_says_when_a_first_auto_run_measures_the_curve(qwen3_tied_dirs, monkeypatch, tmp_path, capsys):
    """generate, parity and bench measure a missing curve first with progress on stderr (a large
    vocabulary on a CPU took 7.5 silent minutes), and the run's prefill time no longer holds it."""
    from app.cli import main as cli

    from helpers import PROMPTS

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    monkeypatch.setattr(cc, "SWEEP_BUDGET_S", 0.0)  # no sweeps past `repeats`: the progress still counts 9 a depth
    t, d = qwen3_tied_dirs
    argv = ["generate", "--target", str(t), "--drafter", str(d), "--prompt", PROMPTS[0], "--raw", "--max-tokens", "8",
            "--block-size", "auto", "--json"]
    assert cli(argv) == 0
    err = capsys.readouterr().err
    assert "auto verify length: this machine's cost curve for this pair, measured 18/18" in err
    assert "measured 18/18, done" in err
    # stderr here is no terminal (a log): whole lines, a few of them, not one line rewritten with \r
    assert "\r" not in err and 2 <= len(err.splitlines()) <= 4
    assert cli(argv) == 0
    assert "cost curve" not in capsys.readouterr().err  # cached: nothing to say
    assert cli(["parity", *argv[1:-1], "--draft-window", "32", "--json"]) == 0  # another drafter context
    assert "measured 18/18" in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: one line, rewritten as it goes
    assert cli(["parity", *argv[1:-1], "--draft-window", "16", "--json"]) == 0
    err = capsys.readouterr().err
    assert err.count("\r") >= 2 and err.endswith("measured 18/18, done\n") and err.count("\n") == 1


def test_an_unwritable_cache_costs_one_measurement_per_process(qwen3_pair, monkeypatch, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(blocked))
    said = []
    first, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1, progress=said.append)
    assert not cached
    assert any(m.startswith("the curve is not cached (") and "the next command measures it again" in m for m in said)
    again, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)
    assert cached and again == first


def test_a_sharded_run_measures_its_curve_once_per_process(qwen3_pair, monkeypatch, tmp_path):
    """A sharded target's curve is never read from a host's cache (every rank measures, rank 0's
    timings kept), but it was measured again at every run's start: a sharded `bench` of 10 prompts
    measured it 20 times. Now once per process (every rank runs the same commands, so every rank finds
    it at the same point), again for another block or with --fresh, and never written to the cache."""
    from engine.decode.cost_curve_data import CurveStore
    from engine.runtime.distributed import Ranks

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "_agreed", lambda curve, pair: curve)  # one process: no peers to agree with
    calls = []
    real = cc.measure_steps
    monkeypatch.setattr(cc, "measure_steps", lambda pair, **k: calls.append(k["block"]) or real(qwen3_pair, **k))
    sharded = replace(qwen3_pair, ranks=Ranks(rank=0, size=2), curves=CurveStore())
    first, cached = cc.cost_curve(sharded, block=3, repeats=1)
    assert not cached and calls == [3]
    again, cached = cc.cost_curve(sharded, block=3, repeats=1)
    assert cached and again == first and calls == [3]
    _, cached = cc.cost_curve(sharded, block=2, repeats=1)
    assert not cached and calls == [3, 2]
    _, cached = cc.cost_curve(sharded, block=3, repeats=1, fresh=True)
    assert not cached and calls == [3, 2, 3]
    assert not (tmp_path / "cost-curves").exists()  # a host's cache is for its unsharded runs
    _, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)  # the same pair unsharded: its own cache
    assert not cached and calls == [3, 2, 3, 3]
