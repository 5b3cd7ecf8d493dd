"""The target model: loading through mlx-lm, its caches, and the pieces the drafter borrows."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn

from engine.errors import CheckpointError
from engine.models.drafter_config import flat_config

# Families whose decoder multiplies token embeddings by sqrt(hidden_size).
SCALED_EMBEDDING_TYPES = {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "recurrent_gemma"}


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
        self.softcap = args.get("final_logit_softcapping")
        self.logit_scale = args.get("logit_scale") if self.model_type.startswith("cohere") else None
        self.logits_scaling = args.get("logits_scaling") if self.model_type.startswith("granite") else None
        self.hidden_size = int(args.get("hidden_size", 0))
        self.vocab_size = int(args.get("vocab_size", 0))
        # args, not the layer list: a pipelined model lists only this rank's layers
        self.num_layers = int(args.get("num_hidden_layers") or len(decoder_layers(model)))
        # A tensor-parallel untied head computes a slice of the vocabulary per rank.
        owner = getattr(model, "language_model", model)
        self.sharding_group = getattr(owner, "sharding_group", None) if self.lm_head is not None else None
        self.dtype = _param_dtype(self.embed_tokens)
        self.embed_scale = self.model_type in SCALED_EMBEDDING_TYPES

    def embed(self, ids: mx.array) -> mx.array:
        h = self.embed_tokens(ids)
        if self.embed_scale:
            h = h * mx.array(self.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
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
        if self.logit_scale:
            out = out * self.logit_scale
        if self.logits_scaling:
            out = out / self.logits_scaling
        if self.softcap:
            out = mx.tanh(out / self.softcap) * self.softcap
        return out


def _param_dtype(module: nn.Module) -> Any:
    scales = getattr(module, "scales", None)  # quantized: weight is packed uint32
    return scales.dtype if scales is not None else module.weight.dtype


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
