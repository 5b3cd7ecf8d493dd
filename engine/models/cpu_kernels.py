"""Put the CPU kernels into a target's model files when MLX runs on the CPU.

mlx-lm's layers call module-level functions of their own model file (`swiglu` in the MLPs,
`scaled_dot_product_attention` in the attention layers), so those names are replaced there
with dispatchers: kernels/cpu_swiglu.py takes float32 blocks of several tokens (verifies,
prefills), kernels/verify_attention.py's host path takes float32 verify blocks, and everything
else, one-token steps included, goes to mlx-lm's function unchanged. Every model of those files
in this process gets them: outside the cases they take they are mlx-lm's own.
DFLASH_NO_CPU_KERNELS=1 leaves mlx-lm alone (to compare, or if one is ever suspected).
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import mlx.nn as nn

from kernels.cpu_swiglu import swiglu_with_fallback
from kernels.verify_attention import sdpa_with_fallback

DISABLE_ENV = "DFLASH_NO_CPU_KERNELS"
DISPATCHERS = {"swiglu": swiglu_with_fallback, "scaled_dot_product_attention": sdpa_with_fallback}


def install_cpu_kernels(model: nn.Module, device: mx.Device) -> list[str]:
    """Install the dispatchers in the model files of `model`'s layers when `device` is the CPU
    (once per file and name), and take them out otherwise; return the names that dispatch, e.g.
    "mlx_lm.models.qwen3.swiglu"."""
    enabled = device == mx.cpu and os.environ.get(DISABLE_ENV, "") in ("", "0")
    installed = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(name)
        if module is None or not name.startswith("mlx_lm.models."):
            continue
        for function, wrap in DISPATCHERS.items():
            current = getattr(module, function, None)
            if not callable(current):
                continue
            if not enabled:  # mlx-lm's own again, should an earlier load have installed it
                setattr(module, function, getattr(current, "stock", current))
                continue
            if not hasattr(current, "stock"):
                setattr(module, function, wrap(current))
            installed.append(f"{name}.{function}")
    return installed
