"""Taps and parity across the mlx-lm families the engine supports."""

import mlx.core as mx
import pytest

from fixtures import tiny_models as tm
from engine.decode.settings import GenerationSettings
from engine.tools.parity import run_parity
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair
from engine.runtime.streams import STREAM
from engine.models.target import make_target_cache
from engine.models.taps import install_taps, remove_taps

from conftest import PROMPTS
from helpers import run

FAMILIES = ["qwen3", "qwen2", "llama", "mistral", "gemma3_text"]
LONG = PROMPTS[0] + "\n" + PROMPTS[1]  # longer than the 8-token sliding windows of the fixtures


@pytest.fixture(scope="module", params=FAMILIES)
def family_pair(request, models_root, tokenizer_dir):
    root = models_root / f"family-{request.param}"
    if not root.exists():
        tm.write_target(root / "target", tokenizer_dir, model_type=request.param, seed=5)
        tm.write_drafter(root / "drafter", root / "target", seed=6)
    return load_pair(root / "target", root / "drafter")


def test_taps_are_layer_outputs(family_pair):
    """Tap every layer: the last one, through the final norm and head, must give the logits."""
    pair = family_pair
    model = pair.target
    n_layers = pair.head.num_layers
    ids = mx.array(encode_prompt(pair.tokenizer, LONG, chat=False))[None]
    with mx.stream(STREAM):
        recorder = install_taps(model, list(range(n_layers)))
        try:
            recorder.recording = True
            logits = model(ids, cache=make_target_cache(model))
            recorder.recording = False
            taps = recorder.concatenated()
            H = pair.head.hidden_size
            assert taps.shape == (1, ids.shape[1], n_layers * H)
            norm = [m for name, m in model.named_modules() if name.endswith("model.norm") or name == "norm"][0]
            rebuilt = pair.head.logits(norm(recorder.outputs[n_layers - 1]))
            assert mx.allclose(rebuilt, logits, atol=1e-4).item()
        finally:
            remove_taps(model)
            pair.taps = install_taps(model, pair.drafter.cfg.target_layer_ids)


def test_greedy_parity(family_pair):
    for prompt in (LONG, PROMPTS[2]):
        ids = encode_prompt(family_pair.tokenizer, prompt, chat=False)
        result = run_parity(family_pair, ids, GenerationSettings(max_tokens=40))
        assert result.identical or result.margin_at_divergence < result.near_tie, result.to_dict()


def test_ar_matches_mlx_lm_generate_past_the_window(family_pair):
    """Our AR (plain caches) must equal mlx-lm's own generate (rotating caches for sliding layers)."""
    from mlx_lm.generate import stream_generate

    pair = family_pair
    ids = encode_prompt(pair.tokenizer, LONG, chat=False)
    ours, _ = run(pair, ids, mode="ar", max_tokens=24)
    with mx.stream(STREAM):
        theirs = [r.token for r in stream_generate(pair.target, pair.tokenizer, mx.array(ids), max_tokens=24)]
    n = min(len(ours.token_ids), len(theirs))
    assert ours.token_ids[:n] == theirs[:n]


@pytest.fixture(scope="module")
def quantized_dirs(qwen3_tied_dirs, models_root):
    """The tiny Qwen3 target quantized to 4 bits with mlx-lm's own tools, saved and reloaded."""
    import json
    import shutil

    from mlx_lm.utils import load, quantize_model, save_config, save_model

    out = models_root / "qwen3-q4-target"
    if not out.exists():
        model, _, config = load(str(qwen3_tied_dirs[0]), return_config=True)
        model, config = quantize_model(model, config, group_size=32, bits=4)
        out.mkdir()
        save_model(out, model)
        save_config(config, out / "config.json")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(qwen3_tied_dirs[0] / name, out / name)
        assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 4
    return out, qwen3_tied_dirs[1]


def test_quantized_target_runs_losslessly(quantized_dirs):
    pair = load_pair(*quantized_dirs)
    assert type(pair.head.embed_tokens).__name__ == "QuantizedEmbedding"
    assert pair.drafter.fc.weight.dtype == pair.head.dtype  # drafter computes in the target's dtype
    for prompt in (LONG, PROMPTS[3]):
        ids = encode_prompt(pair.tokenizer, prompt, chat=False)
        result = run_parity(pair, ids, GenerationSettings(max_tokens=32))
        assert result.identical or result.margin_at_divergence < result.near_tie, result.to_dict()
        assert result.dflash.num_rounds > 0
