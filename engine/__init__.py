"""DFlash engine (no Qt): decode/ (the round loop), models/ (target, drafter, loading, doctor), tools/ (CLI, bench, parity, trace), runtime/ (BLAS, streams), training/ (train-drafter)."""

from engine.runtime import blas as _blas

_blas.preload()  # must run before anything imports mlx.core

__version__ = "0.1.0"
