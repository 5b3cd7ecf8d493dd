"""train-drafter --arch dflash2: the training forward is the inference forward, the selector learns,
--init grows a v1 drafter into DFlash2 without changing its first drafts, and the result is a
published-layout checkpoint that doctor passes and that decodes losslessly."""

from dataclasses import replace

import mlx.core as mx
import pytest

from app.cli import main as cli
from engine.decode.settings import GenerationSettings
from engine.decode.prompts import encode_prompt
from engine.errors import DFlashError
from engine.models.checkpoint import read_tensor_shapes
from engine.models.drafter2 import DFlash2Drafter
from engine.models.drafter_config import parse_drafter_config
from engine.models.pair import load_pair
from engine.tools.parity import run_parity
from engine.training.trainer import TrainSettings

from fixtures.tiny_dflash2 import dflash2_config_dict
from helpers import PROMPTS, SMALL_TRAINING as SMALL, make_trainer, run

SMALL2 = replace(SMALL, arch="dflash2", selector_rank=8, selector_top_k=6)


def test_training_forward_matches_inference_with_convs(qwen3_pair):
    """Blocks trained at anchor p see what inference shows them at p: the convs stay inside a block."""
    raw = dflash2_config_dict(qwen3_pair.target_config, 1, layers=2, block_size=8, window=6)
    drafter = DFlash2Drafter(parse_drafter_config(raw, "config.json"))
    mx.random.seed(4)
    for layer in drafter.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            conv.kernel_projection.weight = 0.2 * mx.random.normal(conv.kernel_projection.weight.shape)
    S, L = 20, 8
    taps = mx.random.normal((1, S, drafter.cfg.num_taps * drafter.cfg.hidden_size))
    blocks = mx.random.normal((1, 2, L, drafter.cfg.hidden_size))
    trained = drafter.forward_blocks(blocks, taps, mx.array([[3, 11]]))
    for j, p in enumerate([3, 11]):
        inferred = drafter(blocks[:, j], taps[:, :p], drafter.make_cache(), p)
        assert mx.allclose(trained[:, j], inferred, atol=1e-4).item(), p


def test_the_selector_learns_to_rescore(qwen3_tied_dirs, corpus_dir, tmp_path):
    """After training, the selector's K-way loss on held-out blocks is below what the same drafter
    scores with its bilinear term switched off (the head's own ranking of the candidates)."""
    import numpy as np

    trainer = make_trainer(qwen3_tied_dirs[0], corpus_dir, tmp_path / "d",
                           replace(SMALL2, steps=300, batch=4, seq_len=32, lr=5e-3, warmup=5, eval_every=400))
    trainer.run(checkpoint_every=100)
    emb, taps, anchors, labels, prev = trainer.batch(trainer.eval_tokens, np.random.default_rng(1), 4)

    def selector_loss():
        hidden, logits = trainer._draft(emb, taps, anchors)
        return float(trainer._selector_ce(hidden, logits, prev, labels).item())

    trained = selector_loss()
    projection = trainer.drafter.candidate_selector.hidden_projection
    projection.weight = mx.zeros_like(projection.weight)
    plain = selector_loss()
    assert 0 < trained < plain - 0.1, (trained, plain)


def test_init_from_v1_keeps_its_drafts_then_trains(qwen3_tied_dirs, corpus_dir, tmp_path):
    target = qwen3_tied_dirs[0]
    v1 = tmp_path / "v1"
    make_trainer(target, corpus_dir, v1, replace(SMALL, steps=20)).run(checkpoint_every=100)
    grown = make_trainer(target, corpus_dir, tmp_path / "v2", replace(SMALL2, init=str(v1), steps=1))
    assert grown.cfg.generation == 2 and grown.s.arch == "dflash2"
    grown.save_drafter(tmp_path / "v2-step0")
    first = load_pair(target, v1)
    second = load_pair(target, tmp_path / "v2-step0")
    _, a = run(first, PROMPTS[0], max_tokens=24, block_size=8)
    _, b = run(second, PROMPTS[0], max_tokens=24, block_size=8)
    assert [r.drafted for r in a] == [r.drafted for r in b]  # identity convs, a selector that adds nothing yet
    with pytest.raises(DFlashError, match="keeps them"):
        make_trainer(target, corpus_dir, tmp_path / "v3",
                     replace(SMALL, init=str(tmp_path / "v2-step0"), selector_rank=32))


def test_cli_trains_a_dflash2_drafter_that_runs_losslessly(qwen3_tied_dirs, corpus_dir, tmp_path, capsys):
    target, out = qwen3_tied_dirs[0], tmp_path / "d2"
    assert cli(["train-drafter", "--arch", "dflash2", "--target", str(target), "--data", str(corpus_dir),
                "--out", str(out), "--steps", "40", "--batch", "4", "--seq-len", "64", "--block-size", "8",
                "--selector-top-k", "6", "--selector-rank", "16", "--lr", "5e-3", "--warmup", "5",
                "--eval-every", "20", "--checkpoint-every", "20"]) == 0
    names = read_tensor_shapes(out / "model.safetensors")
    assert "candidate_selector.predecessor_codebook" in names  # published naming, as z-lab ships it
    assert cli(["doctor", "--target", str(target), "--drafter", str(out)]) == 0
    assert "DFlash2" in capsys.readouterr().out
    pair = load_pair(target, out)
    for prompt in PROMPTS[:3]:
        ids = encode_prompt(pair.tokenizer, prompt, chat=False)
        result = run_parity(pair, ids, GenerationSettings(max_tokens=32, block_size=8))
        assert result.identical or result.margin_at_divergence < result.near_tie, result.to_dict()
    assert TrainSettings().arch == "dflash"  # v1 stays the default
