"""The target model: loading through mlx-lm, its caches, and the pieces the drafter borrows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn

from engine.errors import CheckpointError
from engine.models.drafter_config import flat_config
from engine.json_text import is_number

# What the target does to its token embeddings and logits, from the keys of its own args (those its
# mlx-lm family declares, so a key counts only where the family's forward applies it).
EMBED_MULTIPLIER_KEYS = ("embedding_multiplier", "scale_emb", "mup_embedding_multiplier")  # embed(ids) * value
SQRT_HIDDEN_KEYS = ("mup_enabled", "embeddings_scale_by_sqrt_dim")  # true: embed(ids) * sqrt(hidden_size)
LOGIT_MULTIPLIER_KEYS = ("logit_scale", "output_multiplier")  # logits * value
LOGIT_DIVISOR_KEYS = ("logits_scaling", "mup_width_multiplier")  # logits / value
# MiniCPM: the final hidden state / (hidden_size / dim_model_base), i.e. logits * dim_model_base / hidden_size.
LOGIT_BASE_KEY = "dim_model_base"
# Gemma scales by sqrt(hidden_size) in its architecture, with no config key to say so (Gemma 4 and
# others that keep the figure as the model's `embed_scale` are read from the model).
SQRT_HIDDEN_TYPES = {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n"}
# Real scales are 0.03..256; one past this is a corrupt config (and an integer past 64 bits breaks
# MLX's arithmetic in the target's own forward).
MAX_FACTOR = 1e6


def decoder_layers(model: nn.Module) -> list:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise CheckpointError(
            f"target model type '{getattr(model, 'model_type', type(model).__name__)}' does not expose "
            "its decoder layer list, so its hidden states cannot be tapped."
        )
    return layers


def make_target_cache(model: nn.Module) -> list:
    """The model's own cache list, with rotating (sliding-window) caches made plain.

    A RotatingKVCache cannot be trimmed once it wraps, which a partial accept needs.
    A plain KVCache gets the same windowed mask from mlx-lm (create_attention_mask
    applies window_size to it, single-token steps included), so attention is unchanged;
    it only keeps the out-of-window keys. AR and DFlash use the same cache either way.
    """
    from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

    return [KVCache() if isinstance(c, RotatingKVCache) else c for c in make_prompt_cache(model)]


def rollback_kind(model: nn.Module) -> str:
    """How a partial accept is undone in this target's caches, by default: "tape-replay" for
    hybrid (GatedDeltaNet) targets, "kv-trim" for attention-only ones, "none" where neither works."""
    from mlx_lm.models.cache import can_trim_prompt_cache

    from engine.models.gdn_tape import is_hybrid

    cache = make_target_cache(model)
    if is_hybrid(model, cache):
        return "tape-replay"
    return "kv-trim" if can_trim_prompt_cache(cache) else "none"


def _find_module(model: nn.Module, suffix: str) -> Optional[nn.Module]:
    for name, module in model.named_modules():
        if name == suffix or name.endswith("." + suffix):
            return module
    return None


def model_args(model: nn.Module) -> dict[str, Any]:
    """The model's args as a flat dict (text_config merged in for multimodal wrappers)."""
    args = getattr(model, "args", None)
    return flat_config(dict(vars(args)) if args is not None else {})


class TargetHead:
    """Embedding, output head and logit scaling of a target, for the drafter to borrow."""

    def __init__(self, model: nn.Module):
        args = model_args(model)
        self.model_type = str(args.get("model_type", getattr(model, "model_type", "")))
        self.embed_tokens = _find_module(model, "embed_tokens")
        if self.embed_tokens is None:
            raise CheckpointError(f"target model type '{self.model_type}' has no embed_tokens to borrow.")
        # Wrappers (e.g. qwen3_5's language_model) keep an untied head below the top level.
        lm_head = getattr(model, "lm_head", None) or _find_module(model, "lm_head")
        self.lm_head = lm_head if isinstance(lm_head, nn.Module) else None
        self.hidden_size = int(args.get("hidden_size", 0))
        self.softcap = _factor(args, "final_logit_softcapping")
        self.logit_scale = logit_scale(args, self.hidden_size)
        self.vocab_size = int(args.get("vocab_size", 0))
        # args, not the layer list: a pipelined model lists only this rank's layers
        self.num_layers = int(args.get("num_hidden_layers") or len(decoder_layers(model)))
        # A tensor-parallel untied head computes a slice of the vocabulary per rank.
        owner = getattr(model, "language_model", model)
        self.sharding_group = getattr(owner, "sharding_group", None) if self.lm_head is not None else None
        self.dtype = _param_dtype(self.embed_tokens, model)
        self.embed_scale = embed_scale(args, self.model_type, _embedding_owner(model))

    def embed(self, ids: mx.array) -> mx.array:
        h = self.embed_tokens(ids)
        if self.embed_scale != 1.0:
            h = h * mx.array(self.embed_scale, h.dtype)
        return h

    def raw_logits(self, hidden: mx.array) -> mx.array:
        """The output head alone, without the target's logit scaling or soft cap."""
        out = self.lm_head(hidden) if self.lm_head is not None else self.embed_tokens.as_linear(hidden)
        if self.sharding_group is not None:
            from mlx_lm.models.base import gather_last_axis

            out = gather_last_axis(out, self.sharding_group)
        return out

    def logits(self, hidden: mx.array) -> mx.array:
        out = self.raw_logits(hidden)
        if self.logit_scale != 1.0:
            out = out * self.logit_scale
        if self.softcap:
            out = mx.tanh(out / self.softcap) * self.softcap
        return out


def _factor(args: dict[str, Any], key: str) -> Optional[float]:
    """The positive number under `key`; None where it is absent, null or 0 (off)."""
    value = args.get(key)
    if value is None or value == 0:
        return None
    if not is_number(value) or not 0 < value <= MAX_FACTOR:
        raise CheckpointError(f"target config: '{key}' should be a positive number up to {MAX_FACTOR:g}, "
                              f"found {value!r}.")
    return float(value)


def embed_scale(args: dict[str, Any], model_type: str, owner: Optional[nn.Module]) -> float:
    """What the target multiplies its token embeddings by before its first layer."""
    held = getattr(owner, "embed_scale", None)  # the model keeps the figure itself
    if is_number(held):
        return float(held)
    if model_type in SQRT_HIDDEN_TYPES or any(args.get(key) is True for key in SQRT_HIDDEN_KEYS):
        return math.sqrt(int(args.get("hidden_size", 0)))
    scale = 1.0
    for key in EMBED_MULTIPLIER_KEYS:
        scale *= _factor(args, key) or 1.0
    return scale


def logit_scale(args: dict[str, Any], hidden_size: int) -> float:
    """What the target multiplies its head's output by (before any soft cap)."""
    scale = 1.0
    for key in LOGIT_MULTIPLIER_KEYS:
        scale *= _factor(args, key) or 1.0
    for key in LOGIT_DIVISOR_KEYS:
        scale /= _factor(args, key) or 1.0
    base = _factor(args, LOGIT_BASE_KEY)
    if base is not None and hidden_size:
        scale *= base / hidden_size
    return scale


def _embedding_owner(model: nn.Module) -> Optional[nn.Module]:
    """The module holding the target's `embed_tokens` (it may keep an `embed_scale` beside it)."""
    for _, module in model.named_modules():
        if isinstance(getattr(module, "embed_tokens", None), nn.Module):
            return module
    return None


def _param_dtype(module: nn.Module, model: nn.Module) -> Any:
    """The dtype the target computes in, which the drafter takes: the embedding's weights', or where
    they are quantized (packed uint32) the scales' (affine: the model's dtype). The mxfp4, nvfp4 and
    mxfp8 modes keep uint8 scales: then the model's float parameters (norms) say it; the scales'
    dtype once made every drafter weight a uint8 zero."""
    scales = getattr(module, "scales", None)
    if scales is None:
        return module.weight.dtype
    if mx.issubdtype(scales.dtype, mx.floating):
        return scales.dtype
    from mlx.utils import tree_flatten

    floats = [v.dtype for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)]
    return max(set(floats), key=floats.count) if floats else mx.float32


def load_target(path: Path):
    """(model, tokenizer, config) through mlx-lm's own loader, with errors made specific."""
    from mlx_lm.utils import load

    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path / 'config.json'}: config.json is missing; a target model folder needs one.")
    if not list(path.glob("*.safetensors")):
        raise CheckpointError(f"{path}: no *.safetensors weights in the target folder.")
    try:
        return load(str(path), return_config=True)
    except CheckpointError:
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300]  # mlx-lm's messages can span lines
        raise CheckpointError(f"{path}: mlx-lm could not load this target ({type(exc).__name__}: {detail}).") from None
