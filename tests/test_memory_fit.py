"""Whether a pair fits this machine's memory, before any load: weights from the files' sizes, the
KV cache at the target's context from config.json (attention layers only for hybrid targets, plus
their recurrent state), against the machine's physical memory; and the models panel's line."""

import json
import os

import pytest

from engine.models import memory_fit
from engine.models.memory_fit import GIB, estimate, estimate_pair, human_bytes, layer_kinds, machine_memory

# The tiny fixtures: targets of 4 layers, 2 KV heads of 16, float32, 4,096 positions; drafters of
# 2 layers with the same attention shape and no dtype of their own (so the target's).
TINY_TARGET_KV = 4 * 2 * 2 * 16 * 4 * 4096
TINY_DRAFTER_KV = 2 * 2 * 2 * 16 * 4 * 4096


def size_of(folder, pattern="*.safetensors"):
    return sum(f.stat().st_size for f in folder.glob(pattern))


def write_model(folder, config, weights: dict[str, int]):
    """A config.json and weight files of the given sizes (sparse: nothing is read, only their size)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    for name, size in weights.items():
        with open(folder / name, "wb") as f:
            f.truncate(size)
    return folder


def test_the_tiny_pair_weights_are_its_files_and_the_kv_cache_its_layers(qwen3_tied_dirs):
    target, drafter = qwen3_tied_dirs
    e = estimate(target, drafter, machine=16 * GIB)
    assert e.weights == size_of(target) + size_of(drafter) and e.weights > 0
    assert (e.kv_cache, e.state, e.context) == (TINY_TARGET_KV + TINY_DRAFTER_KV, 0, 4096)
    assert e.fits is True and e.total == e.weights + e.kv_cache
    alone = estimate(target, None, machine=16 * GIB)
    assert (alone.weights, alone.kv_cache) == (size_of(target), TINY_TARGET_KV)


def test_a_sliding_drafter_layer_holds_only_its_window(sliding_dirs):
    target, drafter = sliding_dirs  # drafter layers: sliding (window 8), full
    e = estimate(target, drafter)
    per_position = 2 * 2 * 16 * 4
    assert e.kv_cache == TINY_TARGET_KV + per_position * 8 + per_position * 4096


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_a_hybrid_target_caches_only_its_attention_layers_plus_the_recurrent_state(tmp_path, kind):
    from fixtures.tiny_hybrid import hybrid_config

    config = hybrid_config(kind, vocab_size=512, eos_id=0)  # 6 layers, every 3rd attention
    folder = write_model(tmp_path / kind, config, {"model.safetensors": 123_456})
    assert layer_kinds(memory_fit.text_fields(config)).count("full") == 2
    e = estimate(folder, machine=GIB)
    assert e.weights == 123_456
    assert e.kv_cache == 2 * (2 * 2 * 16 * 4) * 4096  # 2 attention layers, 2 KV heads of 16, float32
    conv = (4 - 1) * (2 * 2 * 16 + 4 * 16) * 4  # kernel 4; 2 key heads of 16 (q and k) + 4 value heads of 16
    recurrence = 4 * 16 * 16 * 4  # 4 value heads, 16 x 16, float32
    assert e.state == 4 * (conv + recurrence)  # 4 GatedDeltaNet layers


# A Qwen3-8B-shaped 4-bit checkpoint (mlx_lm.convert -q): the weights are the files' sizes, the KV
# cache is bf16 (the activations' dtype), 36 layers x 8 KV heads x 128 at 40,960 positions.
QUANTIZED = {
    "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
    "quantization": {"group_size": 64, "bits": 4}, "quantization_config": {"group_size": 64, "bits": 4},
}


def test_a_quantized_target_weighs_its_files_and_may_not_fit(tmp_path):
    shards = {"model-00001-of-00002.safetensors": 3_000_000_000, "model-00002-of-00002.safetensors": 1_600_000_000,
              "consolidated.safetensors": 9_000_000_000}  # not loaded by mlx-lm: not counted
    folder = write_model(tmp_path / "q4", QUANTIZED, shards)
    kv = 36 * 2 * 8 * 128 * 2 * 40960
    small, large = estimate(folder, machine=8 * GIB), estimate(folder, machine=16 * GIB)
    assert (small.weights, small.kv_cache, small.state) == (4_600_000_000, kv, 0)
    assert small.fits is False and large.fits is True
    assert small.line() == ("needs ~9.9 GB of 8.0 GB (weights 4.3 GB + KV cache at 40,960 tokens 5.6 GB); "
                            "does not fit this machine's memory")
    assert large.line() == "needs ~9.9 GB of 16.0 GB (weights 4.3 GB + KV cache at 40,960 tokens 5.6 GB)"


def test_gemma_pattern_and_missing_fields():
    gemma = {"num_hidden_layers": 6, "sliding_window": 512, "sliding_window_pattern": 3}
    assert layer_kinds(gemma) == ["sliding", "sliding", "full"] * 2
    qwen = {"num_hidden_layers": 2, "sliding_window": None, "use_sliding_window": False}
    assert layer_kinds(qwen) == ["full", "full"]
    assert memory_fit.kv_cache_bytes({"num_hidden_layers": 2}, 4096, 2) == 0  # no attention shape: not guessed


def test_unreadable_or_absent_models_give_no_estimate(tmp_path):
    assert estimate_pair(str(tmp_path / "missing")) is None
    assert estimate_pair("nobody/not-in-the-cache") is None  # looked up in the cache only, never downloaded
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("[1, 2")
    assert estimate_pair(str(bad)) is None


def test_machine_memory_and_units():
    memory = machine_memory()
    assert memory is not None and memory > 256 * 1024 ** 2
    assert os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") == memory
    assert (human_bytes(16 * GIB), human_bytes(50 * 1024 ** 2), human_bytes(350_208)) == ("16.0 GB", "50 MB", "0.3 MB")


def test_the_models_panel_says_whether_the_pair_fits(qtbot, make_window, qwen3_tied_dirs, monkeypatch):
    w = make_window()
    panel = w.models
    panel.target.set_value(str(qwen3_tied_dirs[0]))
    panel.drafter.set_value(str(qwen3_tied_dirs[1]))
    panel.check_now()
    assert panel.memory.isVisible() and panel.memory_fits is True
    assert panel.memory.text().startswith("Memory: needs ~") and "KV cache at 4,096 tokens" in panel.memory.text()
    assert panel.memory.objectName() == "hint"
    monkeypatch.setattr(memory_fit, "machine_memory", lambda: 1024 ** 2)  # a 1 MB machine
    panel.check_now()
    assert panel.memory_fits is False and panel.memory.objectName() == "verdictBad"
    assert "does not fit" in panel.memory.text() and "of 1.0 MB" in panel.memory.text()
    panel.target.set_value("")
    panel.check_now()
    assert not panel.memory.isVisible()
