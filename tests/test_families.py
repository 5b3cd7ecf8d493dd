"""Taps and parity across the mlx-lm families the engine supports."""

import mlx.core as mx
import pytest

from fixtures import tiny_models as tm
from fixtures.tiny_models import GRANITE, write_config_target
from engine.decode.settings import GenerationSettings
from engine.tools.parity import run_parity
from engine.decode.prompts import encode_prompt
from engine.models.pair import load_pair
from engine.runtime.streams import STREAM
from engine.models.target import make_target_cache
from engine.models.taps import install_taps, remove_taps

from helpers import PROMPTS, run

FAMILIES = ["qwen3", "qwen2", "llama", "mistral", "gemma3_text", "granite"]
LONG = PROMPTS[0] + "\n" + PROMPTS[1]  # longer than the 8-token sliding windows of the fixtures


@pytest.fixture(scope="module", params=FAMILIES)
def family_pair(request, models_root, tokenizer_dir):
    root = models_root / f"family-{request.param}"
    if not root.exists():
        if request.param == "granite":
            write_config_target(root / "target", tokenizer_dir, "granite", seed=5, **GRANITE)
        else:
            tm.write_target(root / "target", tokenizer_dir, model_type=request.param, seed=5)
        tm.write_drafter(root / "drafter", root / "target", seed=6)
    return load_pair(root / "target", root / "drafter")


def test_embeddings_are_the_first_layers_input(family_pair):
    """What the drafter borrows as the target's embedding is what the target's first layer receives:
    Gemma's sqrt(hidden_size), Granite's embedding_multiplier, nothing for the others."""
    model = family_pair.target
    layer = model.layers[0]
    plain, seen = type(layer), []

    class Recording(plain):
        def __call__(self, x, *args, **kwargs):
            seen.append(x)
            return plain.__call__(self, x, *args, **kwargs)

    ids = mx.array(encode_prompt(family_pair.tokenizer, PROMPTS[2], chat=False))[None]
    layer.__class__ = Recording
    try:
        with mx.stream(STREAM):
            model(ids, cache=make_target_cache(model))
    finally:
        layer.__class__ = plain
    with mx.stream(STREAM):
        assert mx.allclose(family_pair.head.embed(ids), seen[0], atol=1e-5).item()


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


@pytest.fixture(scope="module", params=["affine", "mxfp4"])
def quantized_dirs(qwen3_tied_dirs, models_root, request):
    """The tiny Qwen3 target quantized to 4 bits with mlx-lm's own tools, saved and reloaded: affine
    (scales and biases in the model's dtype) and mxfp4 (uint8 scales, no biases; the drafter once took
    the scales' dtype, so every weight of it became a uint8 zero and no draft was ever accepted)."""
    import json
    import shutil

    from mlx_lm.utils import load, quantize_model, save_config, save_model

    mode = request.param
    out = models_root / f"qwen3-q4-{mode}-target"
    if not out.exists():
        model, _, config = load(str(qwen3_tied_dirs[0]), return_config=True)
        model, config = quantize_model(model, config, group_size=32, bits=4, mode=mode)
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
    assert pair.head.dtype == pair.target.model.norm.weight.dtype  # the model's dtype, not uint8 scales'
    assert float(mx.abs(pair.drafter.fc.weight).sum()) > 0  # its weights, not zeros
    for prompt in (LONG, PROMPTS[3]):
        ids = encode_prompt(pair.tokenizer, prompt, chat=False)
        result = run_parity(pair, ids, GenerationSettings(max_tokens=32))
        assert result.identical or result.margin_at_divergence < result.near_tie, result.to_dict()
        assert result.dflash.num_rounds > 0


def test_scaling_comes_from_config_keys_not_family_names():
    from engine.errors import CheckpointError
    from engine.models.target import embed_scale, logit_scale

    # Any family whose args declare the key, whatever it is called.
    assert logit_scale({"model_type": "command_z", "logit_scale": 0.25}, 64) == 0.25
    assert logit_scale({"model_type": "ibm_next", "logits_scaling": 4.0}, 64) == 0.25
    assert logit_scale({"model_type": "minicpm", "dim_model_base": 16}, 64) == 0.25
    assert logit_scale({"model_type": "qwen3"}, 64) == 1.0
    assert embed_scale({"model_type": "ibm_next", "embedding_multiplier": 12.0}, "ibm_next", None) == 12.0
    assert embed_scale({"scale_emb": 12, "hidden_size": 64}, "minicpm", None) == 12.0
    assert embed_scale({"mup_enabled": True, "hidden_size": 64}, "afmoe", None) == 8.0
    assert embed_scale({"hidden_size": 64}, "gemma2", None) == 8.0  # Gemma's is in its architecture
    assert embed_scale({"hidden_size": 64}, "gemma4_text", type("M", (), {"embed_scale": 6.0})()) == 6.0
    assert embed_scale({"hidden_size": 64, "logit_scale": 3.0}, "qwen3", None) == 1.0
    for bad in ("x", True, -1.0, float("inf"), []):
        with pytest.raises(CheckpointError, match="'logits_scaling' should be a positive number"):
            logit_scale({"logits_scaling": bad}, 64)


def test_a_dense_target_never_imports_mlx_lm_private_gated_delta_modules(qwen3_tied_dirs):
    """Start-up, loading and a run of a dense pair (CLI and window modules imported) leave mlx-lm's
    private GatedDeltaNet modules alone: a rename there can break hybrid targets only."""
    import subprocess
    import sys

    script = """
import sys
import app.worker, engine.tools.cli  # the window's and the command line's start-up imports
from engine.models.pair import load_pair
from helpers import run
pair = load_pair(sys.argv[1], sys.argv[2])
summary, rounds = run(pair, "def f():", max_tokens=8)
assert rounds and pair.facts()["rollback"] == "kv-trim"
private = ("mlx_lm.models.gated_delta", "mlx_lm.models.qwen3_5", "mlx_lm.models.qwen3_next")
print(sorted(m for m in private if m in sys.modules))
"""
    tests = str(__import__("pathlib").Path(__file__).parent)
    env = {**__import__("os").environ, "PYTHONPATH": tests}
    done = subprocess.run([sys.executable, "-c", script, *map(str, qwen3_tied_dirs)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_mlx_lm_is_bounded_below_its_next_minor():
    """pyproject.toml allows the installed mlx-lm and no later minor (its private modules may change)."""
    import re
    from importlib.metadata import version
    from pathlib import Path

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    spec = SpecifierSet(re.search(r'"mlx-lm([^";]*)"', text).group(1))
    installed = Version(version("mlx-lm"))
    assert installed in spec
    assert Version(f"{installed.major}.{installed.minor + 1}.0") not in spec


def test_quantized_weights_under_a_config_without_quantization_are_named(quantized_dirs, qwen3_tied_dirs, tmp_path):
    """A 4-bit download given its original config.json: doctor said ready, and loading then failed with
    mlx-lm's list of hundreds of unexpected parameters cut at 300 characters (QA pass)."""
    import shutil

    from engine.models.doctor import check_pair

    folder = tmp_path / "q4-wrong-config"
    shutil.copytree(quantized_dirs[0], folder)
    shutil.copy(qwen3_tied_dirs[0] / "config.json", folder / "config.json")
    report = check_pair(folder, quantized_dirs[1])
    assert not report.ok and "the weights are quantized" in report.problems[0]
    assert "has no 'quantization' entry" in report.problems[0] and ".scales" in report.problems[0]
    report = check_pair(*quantized_dirs)  # with its own config it is ready, and says what it is
    assert report.ok and report.facts["target_quantization"].startswith("4 bits, group 32, ")
    assert report.facts["target_quantization"].endswith(("affine", "mxfp4"))
    assert any("MLX multiplies quantized weights" in w for w in report.warnings)  # this CPU: verifies cost more
    assert not any("16-bit floats" in w for w in report.warnings)  # the quantized line says it (bf16 scales aside)
    assert "target_quantization" not in check_pair(*qwen3_tied_dirs).facts


def test_a_16_bit_target_on_the_cpu_is_told_what_it_costs_there(qwen3_tied_dirs, models_root, tokenizer_dir):
    """bfloat16 weights on MLX's CPU: the demo target decoded DFlash at 0.43x its float32 speed (AR 0.74x):
    doctor says so and how to make a float32 copy; a float32 target hears nothing of it."""
    from engine.models.doctor import check_pair

    # its own name (conftest pairs "bf16-target" with a drafter), with a space: the command must quote it
    folder = models_root / "bf16 doctor target"
    if not folder.exists():
        tm.write_target(folder, tokenizer_dir, seed=31, dtype=mx.bfloat16)
    report = check_pair(folder, None)
    assert report.ok and report.facts["target_weights_dtype"] == "BF16"
    half = [w for w in report.warnings if "16-bit floats" in w]
    assert len(half) == 1 and "bfloat16" in half[0] and f"--hf-path '{folder}' " in half[0] and "--dtype float32" in half[0]
    report = check_pair(*qwen3_tied_dirs)
    assert report.facts["target_weights_dtype"] == "F32" and not any("16-bit floats" in w for w in report.warnings)


def test_a_drafter_trained_for_the_unquantized_model_is_not_written_off(quantized_dirs, tmp_path):
    """Training on bf16 and running 4-bit is common: the drafter drafts about as well there (the demo
    drafter on a 4-bit demo target: tau 9.5 on six prompts at block 16, as unquantized), so the warning says so
    instead of 'expect its drafts to be rarely accepted' (QA pass)."""
    import json
    import shutil

    from engine.models.checkpoint import MADE_BY_FILE
    from engine.models.doctor import check_pair

    drafter = tmp_path / "drafter"
    shutil.copytree(quantized_dirs[1], drafter)
    (drafter / MADE_BY_FILE).write_text(json.dumps({"target": {"fingerprint": "the bf16 one", "name": "org/full"}}))
    report = check_pair(quantized_dirs[0], drafter)
    said = next(w for w in report.warnings if "trained for other target weights" in w)
    assert said.startswith("drafter was trained for other target weights than these (org/full,")
    assert "these are quantized (4 bits, group 32, " in said and "quantized copy of that model" in said
