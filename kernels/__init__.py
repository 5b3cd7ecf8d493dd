"""Custom MLX kernels, each with a pure-MLX reference, dispatched by device.

gated_delta: the GatedDeltaNet recurrence with a per-step tape, tape replay and
re-run (on the CPU the reference and a closed-form chunked pass, Metal via mx.fast.metal_kernel, CUDA via
mx.fast.cuda_kernel).

cpu_swiglu: mlx-lm's SwiGLU for float32 blocks of several tokens on the CPU, with an exp
that is faster and more exact than MLX's CPU one (engine/models/cpu_kernels.py installs it).
"""

from kernels.gated_delta import gated_delta_rerun, gated_delta_tape, gpu_backend, select, tape_replay

__all__ = ["gated_delta_rerun", "gated_delta_tape", "gpu_backend", "select", "tape_replay"]
