"""Custom MLX kernels, each with a pure-MLX reference, dispatched by device.

gated_delta: the GatedDeltaNet recurrence with a per-step tape, tape replay and
re-run (on the CPU the reference and a closed-form chunked pass, Metal via mx.fast.metal_kernel, CUDA via
mx.fast.cuda_kernel).

cpu_exp: an exp for float32 arrays on the CPU, faster and more exact than MLX's CPU one, in
elementwise ops that compile into one kernel.

cpu_swiglu: mlx-lm's SwiGLU for float32 blocks of several tokens on the CPU, with cpu_exp's exp.

verify_attention: attention for verify blocks (several query rows over the KV cache): a pure-MLX
reference, a NumPy host path on the CPU (cpu_attention: in MLX's graph with cpu_exp's exp, for
smaller blocks), and (verify_attention_metal) a Metal kernel tried once per shape against the
reference on a Mac. engine/models/kernel_dispatch.py installs them.
"""

from kernels.gated_delta import gated_delta_rerun, gated_delta_tape, gpu_backend, select, tape_replay

__all__ = ["gated_delta_rerun", "gated_delta_tape", "gpu_backend", "select", "tape_replay"]
