"""Running as one rank of an `mlx.launch` job: joining the group, agreeing, and not hanging.

Everything goes through MLX's own distributed engine (`mx.distributed`); this module
only decides whether we were launched, names the backend, broadcasts rank 0's
decisions and watches for a stalled collective. MLX's collectives have no timeout:
a peer that stops answering leaves the others blocked inside `mx.eval`, which
releases the GIL, so a watchdog thread can still end the process with one line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import mlx.core as mx

from engine.errors import DFlashError

# Seconds without progress before a rank gives up (a load gets LOAD_TIMEOUT_S).
ROUND_TIMEOUT_S = float(os.environ.get("DFLASH_RANK_TIMEOUT", "120"))
LOAD_TIMEOUT_S = max(ROUND_TIMEOUT_S, 600.0)
JOIN_TIMEOUT_S = float(os.environ.get("DFLASH_JOIN_TIMEOUT", "120"))  # for the other ranks to start


class DistributedError(DFlashError):
    """The group could not start, or a peer went away."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job; size 1 (and no group) when not launched."""

    rank: int = 0
    size: int = 1
    backend: str = "none"
    group: Any = None  # mx.distributed.Group

    @property
    def root(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.size > 1


SINGLE = Ranks()


def launched_backend() -> Optional[str]:
    """The backend `mlx.launch` (or mpirun) set this process up for, from its environment."""
    env = os.environ
    if "MLX_JACCL_COORDINATOR" in env:
        return "jaccl-ring" if env.get("MLX_JACCL_RING") == "1" else "jaccl"
    if "MLX_HOSTFILE" in env and "MLX_RANK" in env:
        # `mlx.launch -n 1` hands a one-host job an empty hostfile: that is a single process.
        return "ring" if _nonempty(env["MLX_HOSTFILE"]) else None
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        return "mpi"
    if "MLX_WORLD_SIZE" in env and "MLX_RANK" in env:
        return "nccl"
    return None


def _nonempty(path: str) -> bool:
    try:
        return bool(open(path, encoding="utf-8").read().strip())
    except OSError:
        return True  # let init() name the unreadable hostfile


def launched_rank() -> int:
    """This process's rank as its launcher set it (0 where none did): known before joining."""
    return int(os.environ.get("MLX_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def join(joined: Callable[[], None] = lambda: None) -> Ranks:
    """Join the launched group, or return SINGLE when this process was started on its own.

    `joined` runs the moment the group stands. A peer that fails at once makes mlx.launch end this
    rank then, so a caller's SIGTERM handler belongs there: set earlier, it could not run while
    MLX's init waits in C++ holding the GIL, and mlx.launch would wait on this rank (up to
    JOIN_TIMEOUT_S) instead of ending it."""
    backend = launched_backend()
    if backend is None:
        return SINGLE
    if not mx.distributed.is_available(backend):
        raise DistributedError(f"this MLX build has no '{backend}' distributed backend; "
                               "start the job with `mlx.launch --backend ring`.")
    guard = _join_guard(launched_rank(), backend)
    try:
        group = mx.distributed.init(strict=True, backend=backend)
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group))
        joined()
    except (RuntimeError, ValueError) as exc:
        raise DistributedError(f"the {backend} backend could not start ({' '.join(str(exc).split())}); "
                               "check the hostfile's addresses and that every host can reach the others.") from None
    finally:
        guard.kill()
        guard.wait()
    return Ranks(group.rank(), group.size(), backend, group)


def _join_guard(rank: int, backend: str):
    """A helper process that ends this one if joining takes longer than JOIN_TIMEOUT_S.

    MLX's ring init waits for its peers inside C++ without releasing the GIL, so no
    thread of ours can run meanwhile; a separate process can."""
    import subprocess

    message = (f"error: waited {JOIN_TIMEOUT_S:.0f} s for the other ranks to join the {backend} group: check that "
               "every rank was started, the hostfile's addresses and ports, and the firewall." if rank == 0 else "")
    code = ("import os, signal, sys, time\n"
            f"time.sleep({JOIN_TIMEOUT_S!r})\n"
            f"if {message!r}: print({message!r}, file=sys.stderr, flush=True)\n"
            f"os.kill({os.getpid()}, signal.SIGTERM)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def from_root(x: mx.array, ranks: Ranks) -> mx.array:
    """Rank 0's value of `x` on every rank (a sum where the other ranks add zeros), so every rank
    commits exactly the tokens rank 0 decided on, whatever rounding does elsewhere."""
    if not ranks.sharded:
        return x
    # The zeros must depend on x: otherwise a rank other than 0 never evaluates x's graph, skips the
    # model's own collectives inside it, and rank 0 waits in them forever.
    mine = x if ranks.root else mx.depends(mx.zeros_like(x), x)
    return mx.distributed.all_sum(mine, group=ranks.group)


def rank_0_decides(flag: bool, ranks: Ranks) -> bool:
    """Rank 0's `flag` on every rank. For choices made by a clock (take another timing sweep?): each
    host's clock answers differently, and a rank that runs one forward more than another runs the
    model's collectives alone and waits in them forever."""
    if not ranks.sharded:
        return flag
    return bool(from_root(mx.array(int(flag)), ranks).item())


def collective_ms(ranks: Ranks, shape: tuple[int, ...], dtype: Any, repeats: int = 20) -> float:
    """Median wall time of one all_sum of an array of `shape` across the group: what each of the
    model's collectives costs on this link (tensor parallel runs two per layer per forward)."""
    if not ranks.sharded:
        return 0.0
    x = mx.ones(shape, dtype=dtype)
    mx.eval(mx.distributed.all_sum(x, group=ranks.group))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        mx.eval(mx.distributed.all_sum(x, group=ranks.group))
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def peer_lost(exc: BaseException) -> bool:
    """True for the error MLX raises when another rank went away mid-collective."""
    return isinstance(exc, RuntimeError) and "peer" in str(exc).lower()


class Watchdog:
    """Ends the process with one line and exit 2 when no progress is reported in time.

    `expect(seconds, what)` sets the next deadline; `stop()` disarms it. Only rank 0 prints.
    """

    EXIT_CODE = 2

    def __init__(self, rank: int = 0):
        self.rank = rank
        self._deadline: Optional[float] = None
        self._what = ""
        self._seconds = 0.0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="dflash-rank-watchdog", daemon=True)
        self._thread.start()

    def expect(self, seconds: float, what: str) -> None:
        with self._lock:
            self._deadline, self._what, self._seconds = time.monotonic() + seconds, what, seconds

    def stop(self) -> None:
        with self._lock:
            self._deadline = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what, seconds = self._what, self._seconds
            if late:
                if self.rank == 0:
                    print(f"error: no progress for {seconds:.0f} s while {what}: another rank stopped or the "
                          "link hung (set DFLASH_RANK_TIMEOUT to wait longer).", file=sys.stderr, flush=True)
                os._exit(self.EXIT_CODE)


_ARMED: Optional[Watchdog] = None


def arm(watchdog: Optional[Watchdog]) -> None:
    """Make `heartbeat()` feed this watchdog (None disarms)."""
    global _ARMED
    _ARMED = watchdog


def heartbeat(what: str = "running a round") -> None:
    """Progress was made: push the armed watchdog's deadline out. Free when none is armed."""
    if _ARMED is not None:
        _ARMED.expect(ROUND_TIMEOUT_S, what)
