"""A block size turned down reads the longer block's cached curve, cut to it, and measures nothing."""

from engine.decode import cost_curve as cc


def test_a_shorter_block_reuses_a_longer_blocks_curve(qwen3_pair, monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS, 64))
    longer, cached = cc.cost_curve(qwen3_pair, block=5, repeats=1)
    assert not cached and len(longer.points()) == 2
    calls = []
    real = cc.measure_steps
    monkeypatch.setattr(cc, "measure_steps", lambda *a, **k: calls.append(k) or real(*a, **k))
    for block in (4, 2, 1):
        curve, cached = cc.cost_curve(qwen3_pair, block=block, repeats=1)
        assert cached and calls == [] and curve.block == block
        for cut, whole in zip(curve.points(), longer.points()):  # the same figures, up to `block`
            assert cut.depth == whole.depth and cut.verify_ms == whole.verify_ms[:block]
            assert cut.draft_by_length_ms == whole.draft_by_length_ms[:block]
        assert curve.draft_ms == longer.draft_by_length_ms[block - 1] and curve.ar_step_ms == longer.ar_step_ms
    for other in ({"block": 6}, {"block": 3, "window": 8}):  # longer than any measured; another drafter context
        _, cached = cc.cost_curve(qwen3_pair, repeats=1, **other)
        assert not cached
    assert len(calls) == 2
    _, cached = cc.cost_curve(qwen3_pair, block=3, repeats=1, fresh=True)  # fresh measures, whatever is cached
    assert not cached and len(calls) == 3


def test_a_damaged_longer_curve_is_measured_past(qwen3_pair, monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "DEPTHS", (cc.CONTEXT_TOKENS,))
    cc.cost_curve(qwen3_pair, block=4, repeats=1)
    for entry in (tmp_path / "cost-curves").glob("*.json"):
        entry.write_text("{")
    _, cached = cc.cost_curve(qwen3_pair, block=2, repeats=1)
    assert not cached
