"""The cost curve: measured once per target and machine, cached, and printed by `calibrate`."""

from __future__ import annotations

import json

import pytest

from app.cli import main as cli
from engine.decode import cost_curve as cc


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
    real = cc.measure
    monkeypatch.setattr(cc, "measure", lambda *a, **k: calls.append(k) or real(*a, **k))
    again, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1)
    assert cached and again == first and calls == []
    _, cached = cc.cost_curve(qwen3_pair, block=2, repeats=1)  # another block: another entry
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


@pytest.mark.parametrize("block", [0, 65])
def test_absurd_blocks_are_refused(qwen3_pair, block):
    from engine.errors import DFlashError

    with pytest.raises(DFlashError, match="1..64"):
        cc.measure(qwen3_pair, block=block or -1, repeats=1)
