"""Build tiny real checkpoints on disk: tokenizer, target (mlx-lm format) and DFlash drafter.

Tests load these through exactly the loaders users hit. The weights are random
(seeded) unless a builder says otherwise.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.drafter import DFlashDrafter
from engine.drafter_config import SLIDING, parse_drafter_config
from engine.tokenizer_files import MASK_TOKEN, train_bpe_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tokenizer_corpus() -> list[str]:
    """Deterministic text for a tiny tokenizer: sources of a few stdlib modules."""
    import argparse
    import json as json_module
    import textwrap

    return [inspect.getsource(m) for m in (textwrap, json_module.decoder, argparse)]


def write_tokenizer(out_dir: Path, vocab_size: int = 512) -> dict[str, int]:
    return train_bpe_tokenizer(tokenizer_corpus(), out_dir, vocab_size)


def _vocab_and_eos(tokenizer_dir: Path) -> tuple[int, int, int]:
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    size = max(list(vocab.values()) + list(added.values())) + 1
    return size, added["<|endoftext|>"], added[MASK_TOKEN]


def _save(model: nn.Module, out: Path, dtype: Any) -> None:
    weights = {k: v.astype(dtype) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights)


ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


def target_config(
    vocab_size: int,
    eos_id: int,
    model_type: str = "qwen3",
    tied: bool = True,
    hidden: int = 64,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
) -> dict[str, Any]:
    config = {
        "model_type": model_type,
        "architectures": [ARCHITECTURES.get(model_type, "LlamaForCausalLM")],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tied,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }
    if model_type == "mistral":  # sliding-window attention on every other layer
        config["sliding_window"] = 8
        config["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2) + ["full_attention"] * (layers % 2)
    if model_type == "gemma3_text":
        config.update(sliding_window=8, sliding_window_pattern=2, query_pre_attn_scalar=head_dim,
                      rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh")
    return config


def build_target_model(config: dict[str, Any]) -> nn.Module:
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict(config))


def write_target(
    out: Path,
    tokenizer_dir: Path,
    seed: int = 0,
    dtype: Any = mx.float32,
    **config_overrides: Any,
) -> Path:
    """A random target in mlx-lm's format, sharing `tokenizer_dir`'s tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    vocab, eos, _ = _vocab_and_eos(tokenizer_dir)
    config = target_config(vocab, eos, **config_overrides)
    mx.random.seed(seed)
    model = build_target_model(config)
    _save(model, out, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def drafter_config_dict(
    target_config: dict[str, Any],
    mask_id: int,
    layers: int = 2,
    block_size: int = 16,
    schema: str = "legacy",
    tap_ids: Optional[list[int]] = None,
    layer_types: Optional[list[str]] = None,
    sliding_window: Optional[int] = None,
    intermediate: int = 128,
) -> dict[str, Any]:
    """A drafter config in the legacy or the newer published schema."""
    t = target_config
    n_target = t["num_hidden_layers"]
    taps = tap_ids if tap_ids is not None else sorted({min(1 + 2 * i, n_target - 1) for i in range(layers)})
    common = {
        "architectures": ["DFlashDraftModel"],
        "hidden_size": t["hidden_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": t["num_attention_heads"],
        "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t["head_dim"],
        "intermediate_size": intermediate,
        "rms_norm_eps": 1e-6,
        "vocab_size": t["vocab_size"],
        "max_position_embeddings": 4096,
        "tie_word_embeddings": t["tie_word_embeddings"],
        "num_target_layers": n_target,
        "layer_types": layer_types or ["full_attention"] * layers,
    }
    if schema == "legacy":
        common.update(
            block_size=block_size,
            rope_theta=t["rope_theta"],
            dflash_config={"mask_token_id": mask_id, "target_layer_ids": taps},
        )
    else:
        common.update(
            rope_parameters={"rope_theta": t["rope_theta"], "rope_type": "default"},
            dflash_config={"block_size": block_size, "mask_token_id": mask_id, "target_layer_ids": taps},
        )
    if sliding_window is not None or SLIDING in common["layer_types"]:
        common["sliding_window"] = sliding_window
    return common


def write_drafter(out: Path, target_dir: Path, seed: int = 1, dtype: Any = mx.bfloat16, **kwargs: Any) -> Path:
    """A random DFlash drafter for the target in `target_dir`."""
    out.mkdir(parents=True, exist_ok=True)
    tcfg = json.loads((target_dir / "config.json").read_text())
    _, _, mask_id = _vocab_and_eos(target_dir)
    return _write_random_drafter(out, drafter_config_dict(tcfg, mask_id, **kwargs), seed, dtype)


def write_untrained_copy(out: Path, drafter_dir: Path, seed: int = 0) -> Path:
    """A drafter with the config of the one in `drafter_dir` and random weights: what a trained
    drafter's acceptance is measured against."""
    out.mkdir(parents=True, exist_ok=True)
    raw = json.loads((drafter_dir / "config.json").read_text())
    return _write_random_drafter(out, raw, seed, mx.float32)


def _write_random_drafter(out: Path, raw: dict, seed: int, dtype: Any) -> Path:
    cfg = parse_drafter_config(raw, out / "config.json")
    mx.random.seed(seed)
    _save(DFlashDrafter(cfg), out, dtype)
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out


def write_oracle_pair(
    root: Path,
    tokenizer_dir: Path,
    first: int,
    second: int,
    extra_eos: Optional[list[int]] = None,
    third: Optional[int] = None,
    name: str = "oracle",
) -> tuple[Path, Path]:
    """A target and drafter built by hand so that every draft is right.

    Decoder layers are silenced (o_proj and down_proj zero), so the residual
    stream is the token embedding. Embeddings are one-hot by class, and the
    untied head maps: any ordinary token -> `first`, `first` -> `second`,
    `second` -> `second`, mask -> `second`. The drafter, silenced too, sees the
    mask embedding at every block position and so drafts `second` everywhere,
    which is exactly what the target then chooses: every round accepts all.
    With `third`, the target instead alternates `second` -> `third` -> `second`,
    so every round accepts exactly one draft and then corrects.
    """
    target_dir, drafter_dir = root / f"{name}-target", root / f"{name}-drafter"
    target_dir.mkdir(parents=True, exist_ok=True)
    vocab, eos, mask = _vocab_and_eos(tokenizer_dir)
    config = target_config(vocab, eos, tied=False, layers=2)
    if extra_eos:
        config["eos_token_id"] = [eos] + list(extra_eos)
    hidden = config["hidden_size"]
    model = build_target_model(config)
    embed = mx.zeros((vocab, hidden))
    embed[:, 0] = 1.0
    classes = [(first, 1), (second, 2), (mask, 3)] + ([(third, 4)] if third is not None else [])
    for token, dim in classes:
        embed[token] = mx.zeros((hidden,))
        embed[token, dim] = 1.0
    head = mx.zeros((vocab, hidden))
    head[first, 0] = 1.0
    head[second, 1:5] = 1.0
    if third is not None:
        head[second, 2] = 0.0
        head[third, 2] = 1.0
    model.model.embed_tokens.weight = embed
    model.lm_head.weight = head
    for layer in model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    _save(model, target_dir, mx.float32)
    (target_dir / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, target_dir / name)

    drafter_dir.mkdir(parents=True, exist_ok=True)
    raw = drafter_config_dict(config, mask, layers=1)
    drafter = DFlashDrafter(parse_drafter_config(raw, drafter_dir / "config.json"))
    for layer in drafter.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    _save(drafter, drafter_dir, mx.float32)
    (drafter_dir / "config.json").write_text(json.dumps(raw, indent=2))
    return target_dir, drafter_dir
