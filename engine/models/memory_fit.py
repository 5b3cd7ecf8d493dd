"""Will a pair fit this machine's memory? An estimate before any load, from config.json and file
sizes only (no MLX, no tensor read: cheap enough for the window's GUI thread), as LM Studio shows
one before it loads a model.

needs = weights + KV cache at the target's context + recurrent state, where

- weights are the files' sizes: the target's `model*.safetensors` (what mlx-lm loads) and the
  drafter's `*.safetensors`. A quantized checkpoint's files are its quantized weights already.
- the KV cache holds, per attention layer of the target and of the drafter (whose context is the
  target's), K and V: 2 x kv_heads x head_dim values a position in the model's dtype, for
  max_position_embeddings positions (a sliding-window layer at most its window). The KV cache is
  kept in the activations' dtype (`torch_dtype`), also for a quantized model.
- a hybrid target's linear-attention (GatedDeltaNet) layers hold no KV cache but a fixed state:
  the conv state, (kernel - 1) x conv_dim in the model's dtype, and the recurrence,
  value_heads x value_dim x key_dim in float32 (as mlx-lm keeps it).

The machine's memory is its physical memory (sysconf). On a Mac the GPU may wire only part of it
(about three quarters by default), so a pair close to the total can still swap: "fits" is the
upper bound, not a promise.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from engine.json_text import is_int

GIB = 1024 ** 3
MIB = 1024 ** 2
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8}
DEFAULT_DTYPE_BYTES = 2  # a config that names no dtype: published checkpoints are bf16 / fp16
FULL, SLIDING, LINEAR = "full", "sliding", "linear"


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int  # bytes, target and drafter files
    kv_cache: int  # bytes at `context` positions, target and drafter attention layers
    state: int  # bytes of recurrent state (hybrid targets' linear-attention layers)
    context: int  # positions the KV cache is counted at (the target's max_position_embeddings)
    machine: Optional[int]  # bytes of physical memory; None where the system does not say

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.state

    @property
    def fits(self) -> Optional[bool]:
        return None if self.machine is None else self.total <= self.machine

    def line(self) -> str:
        """One line for the window: "needs ~X of Y (weights A + KV cache at N tokens B)"."""
        of = f" of {human_bytes(self.machine)}" if self.machine else ""
        parts = (f"weights {human_bytes(self.weights)} + KV cache at {self.context:,} tokens "
                 f"{human_bytes(self.kv_cache)}")
        if self.state:
            parts += f" + recurrent state {human_bytes(self.state)}"
        verdict = "; does not fit this machine's memory" if self.fits is False else ""
        return f"needs ~{human_bytes(self.total)}{of} ({parts}){verdict}"


def human_bytes(n: int) -> str:
    """Binary units, named as macOS and LM Studio name them (a 16 GB Mac has 16 GiB)."""
    if n >= GIB:
        return f"{n / GIB:.1f} GB"
    if n >= 10 * MIB:
        return f"{n / MIB:.0f} MB"
    return f"{n / MIB:.1f} MB"


def machine_memory() -> Optional[int]:
    """Physical memory in bytes (Linux and macOS), or None."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf; some systems lack the names
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


def read_config(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{folder / 'config.json'}: not a JSON object")
    return config


def text_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields: multimodal wrappers (qwen3_5) nest them under text_config."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def dtype_bytes(config: dict[str, Any], default: int = DEFAULT_DTYPE_BYTES) -> int:
    name = config.get("torch_dtype") or config.get("dtype")
    return DTYPE_BYTES.get(str(name).removeprefix("torch."), default) if name else default


def _int(config: dict[str, Any], key: str, default: int = 0) -> int:
    value = config.get(key)
    return value if is_int(value) and value > 0 else default


def layer_kinds(config: dict[str, Any]) -> list[str]:
    """FULL, SLIDING or LINEAR for each layer, from `layer_types`, a hybrid's full_attention_interval
    (every interval-th layer is attention, the rest GatedDeltaNet, as mlx-lm builds them), or gemma's
    sliding_window_pattern (every pattern-th layer global); otherwise all full (the upper bound)."""
    n = _int(config, "num_hidden_layers")
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return [LINEAR if t == "linear_attention" else SLIDING if t == "sliding_attention" else FULL for t in types]
    interval = _int(config, "full_attention_interval")
    if interval and _int(config, "linear_num_value_heads"):
        return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]
    pattern = _int(config, "sliding_window_pattern")
    if pattern and _int(config, "sliding_window"):
        return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    return [FULL] * n


def kv_cache_bytes(config: dict[str, Any], context: int, dtype: int) -> int:
    """K and V of every attention layer at `context` positions (sliding layers: at most their window)."""
    heads = _int(config, "num_attention_heads")
    if not heads:
        return 0
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim", _int(config, "hidden_size") // heads)
    window = _int(config, "sliding_window", context)
    per_position = 2 * kv_heads * head_dim * dtype
    return sum(per_position * (min(context, window) if kind == SLIDING else context)
               for kind in layer_kinds(config) if kind != LINEAR)


def recurrent_state_bytes(config: dict[str, Any], dtype: int) -> int:
    """The conv state and the float32 recurrence of every linear-attention layer."""
    linear = layer_kinds(config).count(LINEAR)
    if not linear:
        return 0
    key_heads, value_heads = _int(config, "linear_num_key_heads"), _int(config, "linear_num_value_heads")
    key_dim, value_dim = _int(config, "linear_key_head_dim"), _int(config, "linear_value_head_dim")
    conv_dim = 2 * key_heads * key_dim + value_heads * value_dim
    conv = (_int(config, "linear_conv_kernel_dim", 4) - 1) * conv_dim * dtype
    recurrence = value_heads * value_dim * key_dim * 4
    return linear * (conv + recurrence)


def weight_files_bytes(folder: Path, pattern: str) -> int:
    """Sizes of the weight files (symlinks followed: the Hugging Face cache links into its blobs)."""
    files = sorted(folder.glob(pattern)) or sorted(folder.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files)


def estimate(target_dir: Path, drafter_dir: Optional[Path] = None, machine: Optional[int] = None) -> MemoryEstimate:
    """The estimate for a pair of local folders; raises OSError or ValueError on an unreadable config."""
    target = text_fields(read_config(target_dir))
    dtype = dtype_bytes(target)
    context = _int(target, "max_position_embeddings")
    weights = weight_files_bytes(target_dir, "model*.safetensors")
    kv = kv_cache_bytes(target, context, dtype)
    state = recurrent_state_bytes(target, dtype)
    if drafter_dir is not None:
        drafter = text_fields(read_config(drafter_dir))
        weights += weight_files_bytes(drafter_dir, "*.safetensors")
        kv += kv_cache_bytes(drafter, context, dtype_bytes(drafter, default=dtype))
    return MemoryEstimate(weights=weights, kv_cache=kv, state=state, context=context, machine=machine)


def estimate_pair(target: str, drafter: Optional[str] = None,
                  machine: Optional[int] = None) -> Optional[MemoryEstimate]:
    """The estimate for what the user chose (folders, bundled names or Hugging Face ids already in the
    cache: nothing is downloaded), against this machine's memory; None where a folder or its config
    cannot be read (the doctor says why)."""
    from engine.errors import DFlashError
    from engine.models.paths import resolve_model_path

    try:
        target_dir = resolve_model_path(target, download=False)
        drafter_dir = resolve_model_path(drafter, download=False) if drafter else None
        return estimate(target_dir, drafter_dir, machine if machine is not None else machine_memory())
    except (DFlashError, OSError, ValueError):
        return None
