"""Loading a target sharded across the ranks of an `mlx.launch` job, with mlx-lm's own code.

Tensor parallel (`model.shard(group)`) where the model has it, pipeline
(`model.model.pipeline(group)`) where only that exists, and a one-line refusal
naming the model type where neither does. Sizes that the group does not divide
are refused before any weight is read, since mlx-lm would shard them silently wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.errors import CheckpointError
from engine.models.drafter_config import flat_config
from engine.runtime.distributed import Ranks

TENSOR = "tensor"
PIPELINE = "pipeline"

# (config key, what it counts) that tensor parallelism splits across ranks.
TENSOR_SPLIT_SIZES = (
    ("num_attention_heads", "attention heads"),
    ("num_key_value_heads", "key/value heads"),
    ("intermediate_size", "MLP width"),
    ("linear_num_key_heads", "linear-attention key heads"),
    ("linear_num_value_heads", "linear-attention value heads"),
)


def sharding_kind(model: nn.Module) -> str | None:
    """TENSOR, PIPELINE or None for an (unloaded) mlx-lm model."""
    if hasattr(model, "shard"):
        return TENSOR
    inner = getattr(model, "language_model", model)
    if hasattr(getattr(inner, "model", None), "pipeline"):
        return PIPELINE
    return None


def check_divisible(config: dict[str, Any], kind: str, size: int) -> None:
    cfg = flat_config(config)
    model_type = cfg.get("model_type", "?")
    if kind == TENSOR:
        for key, what in TENSOR_SPLIT_SIZES:
            value = cfg.get(key)
            # key/value heads fewer than ranks are repeated by some models (qwen3_5); others need them to divide
            if key == "num_key_value_heads" and isinstance(value, int) and value < size and model_type.startswith("qwen3_5"):
                continue
            if isinstance(value, int) and value % size:
                divisors = [d for d in range(1, value + 1) if value % d == 0 and d <= 16]
                raise CheckpointError(
                    f"target '{model_type}': {size} ranks do not divide its {value} {what} ({key}); "
                    f"run with {', '.join(map(str, divisors))} ranks.")
    else:
        layers = cfg.get("num_hidden_layers")
        if isinstance(layers, int) and layers < size:
            raise CheckpointError(f"target '{model_type}': {size} pipeline ranks for {layers} layers; "
                                  f"use at most {layers} ranks.")


def load_sharded(path: Path, ranks: Ranks) -> tuple[nn.Module, Any, dict[str, Any], str]:
    """(model, tokenizer, config, kind) with this rank's share of the target's weights."""
    from mlx_lm.utils import load_model, load_tokenizer, sharded_load

    try:
        probe, config = load_model(path, lazy=True, strict=False)
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"{path}: mlx-lm could not read this target ({type(exc).__name__}: {detail}).") from None
    kind = sharding_kind(probe)
    if kind is None:
        raise CheckpointError(
            f"target '{config.get('model_type', '?')}': mlx-lm has neither tensor nor pipeline sharding for this "
            f"model type, so it cannot run across {ranks.size} ranks; run it in one process.")
    check_divisible(config, kind, ranks.size)
    del probe
    if kind == TENSOR or (path / "model.safetensors.index.json").is_file():
        groups = {"tensor_group": ranks.group} if kind == TENSOR else {"pipeline_group": ranks.group}
        model, tokenizer, config = sharded_load(str(path), return_config=True, **groups)
        return model, tokenizer, config, kind
    # sharded_load's pipeline path picks weight files by the index; a single-file checkpoint
    # has none, so do its steps here: every rank reads the one file, keeps its layers.
    model, config = load_model(path, lazy=True, strict=False)
    getattr(model, "language_model", model).model.pipeline(ranks.group)
    mx.eval(model.parameters())
    tokenizer = load_tokenizer(path, {"trust_remote_code": True}, eos_token_ids=config.get("eos_token_id"))
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=ranks.group, stream=mx.cpu))
    return model, tokenizer, config, kind


def pipeline_span(model: nn.Module) -> tuple[int, int] | None:
    """(first, end) global layer indices this rank runs, or None when the model is not pipelined."""
    inner = getattr(getattr(model, "language_model", model), "model", None)
    size = getattr(inner, "pipeline_size", 1)
    if size <= 1:
        return None
    end = inner.end_idx if inner.end_idx is not None else len(inner.layers)
    return inner.start_idx, end
