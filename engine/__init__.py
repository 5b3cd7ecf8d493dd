"""DFlash engine: target + drafter loading, rounds, events, CLI. No Qt here."""

from engine.runtime import blas as _blas

_blas.preload()  # must run before anything imports mlx.core

__version__ = "0.1.0"
