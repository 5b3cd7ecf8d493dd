"""Put kernels/cpu_swiglu.py into a target's MLPs when MLX runs on the CPU.

mlx-lm's MLPs call the module-level `swiglu` of their own model file, so that name is
replaced there with a dispatcher that takes float32 blocks of several tokens (verifies,
prefills) and hands everything else, one-token steps included, to mlx-lm's function
unchanged. Every model of those files in this process gets it: outside the cases it takes
it is mlx-lm's own.
DFLASH_NO_CPU_KERNELS=1 leaves mlx-lm alone (to compare, or if one is ever suspected).
"""

from __future__ import annotations

import os
import sys

import mlx.core as mx
import mlx.nn as nn

from kernels.cpu_swiglu import swiglu_with_fallback

DISABLE_ENV = "DFLASH_NO_CPU_KERNELS"


def install_cpu_kernels(model: nn.Module, device: mx.Device) -> list[str]:
    """Install the dispatcher in the model files of `model`'s layers when `device` is the CPU
    (once per file), and take it out otherwise; return the names that dispatch, e.g.
    "mlx_lm.models.qwen3.swiglu"."""
    enabled = device == mx.cpu and os.environ.get(DISABLE_ENV, "") in ("", "0")
    installed = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(name)
        current = getattr(module, "swiglu", None) if name.startswith("mlx_lm.models.") else None
        if not callable(current):
            continue
        if not enabled:  # mlx-lm's own again, should an earlier load have installed it
            module.swiglu = getattr(current, "stock", current)
            continue
        if not hasattr(current, "stock"):
            module.swiglu = swiglu_with_fallback(current)
        installed.append(f"{name}.swiglu")
    return installed
