"""Where a recipe trains, in words, for its model card (a card's timings mean little without it)."""

from __future__ import annotations

import os
import platform


def training_device() -> str:
    """'a 2-core Linux CPU (AMD EPYC)' or 'NVIDIA H200 (MLX's CUDA backend)': the device MLX trains on."""
    import mlx.core as mx

    try:
        name = mx.device_info().get("device_name", "")
    except (AttributeError, RuntimeError):  # an MLX without device_info
        name = ""
    if mx.default_device() == mx.cpu:
        return f"a {os.cpu_count()}-core {platform.system()} CPU" + (f" ({name})" if name else "")
    cuda = getattr(mx, "cuda", None)  # an MLX older than its CUDA backend has no mx.cuda
    backend = "Metal" if mx.metal.is_available() else "CUDA" if cuda and cuda.is_available() else "GPU"
    return f"{name or 'a GPU'} (MLX's {backend} backend)"
