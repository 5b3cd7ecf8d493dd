"""The cost curve as data: what a verify of L tokens, a draft and an AR step cost at each context
depth measured (engine/decode/cost_curve.py measures and caches it), the curve at any depth
between, a round's price, and the fit that keeps timing noise from making a longer verify look
cheaper."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

CONTEXT_TOKENS = 32  # the shortest depth measured: the base curve
SCHEMA = 7  # 2: draft time per block length; 3: depths; 4: an AR step timed beside every verify; 5: sweeps;
# 6: DFlash2 drafts cost less at a large vocabulary (top_k_indices), so older curves overprice them;
# 7: the draws timed with each step (a token drawn, drafts accepted), per kind of sampling


@dataclass
class DepthPoint:
    """The curve measured at one deeper context."""
    depth: int
    ar_step_ms: float
    verify_ms: list[float]
    draft_by_length_ms: Optional[list[float]] = None
    sweeps: int = 0  # how many sweeps the medians are of


@dataclass
class CostCurve:
    target: str
    device: str
    blas: str
    block: int
    repeats: int
    ar_step_ms: float  # one single-token forward, the unit of "AR steps"
    verify_ms: list[float]  # verify_ms[L - 1]: one verify of L tokens (L = 1 is the anchor alone)
    draft_ms: Optional[float]  # one drafter pass over a whole block (None without a drafter)
    measured_at: float  # time.time() of the measurement
    schema: int = SCHEMA
    # draft_by_length_ms[L - 1]: drafting a block of L (a fixed block size L drafts only L); [0] is 0
    draft_by_length_ms: Optional[list[float]] = None
    context: int = CONTEXT_TOKENS  # the depth the fields above were measured at
    deeper: list[DepthPoint] = field(default_factory=list)  # the same at further depths, ascending
    draft_window: int = 0  # the drafter's context as the drafts were measured (settings' draft window)
    draft_sink: int = 0
    sweeps: int = 0  # the base depth's sweeps (`repeats` or more: SWEEP_BUDGET_S)
    sampling: str = "greedy"  # cost_curve.sampling_kind of the draws timed with each step

    def points(self) -> list[DepthPoint]:
        """Every depth measured, the base first."""
        base = DepthPoint(self.context, self.ar_step_ms, self.verify_ms, self.draft_by_length_ms, self.sweeps)
        return [base] + list(self.deeper)

    def at(self, depth: int) -> "CostCurve":
        """The curve at context depth `depth`: interpolated between the two depths around it,
        along the deepest segment past the deepest (never falling), the base below it."""
        points = self.points()
        if len(points) == 1 or depth <= points[0].depth:
            return replace(self, deeper=[])
        low, high = next(((a, b) for a, b in zip(points, points[1:]) if depth <= b.depth), points[-2:])
        w = (depth - low.depth) / (high.depth - low.depth)

        def blend(a: float, b: float) -> float:
            return round(max(a + w * (b - a), b if w > 1 else min(a, b)), 4)

        by_length = None
        if low.draft_by_length_ms and high.draft_by_length_ms:
            by_length = [blend(a, b) for a, b in zip(low.draft_by_length_ms, high.draft_by_length_ms)]
        return replace(self, ar_step_ms=blend(low.ar_step_ms, high.ar_step_ms),
                       verify_ms=[blend(a, b) for a, b in zip(low.verify_ms, high.verify_ms)],
                       draft_by_length_ms=by_length, draft_ms=by_length[-1] if by_length else self.draft_ms,
                       context=depth, deeper=[])

    def verify_in_ar_steps(self) -> list[float]:
        return [round(v / self.ar_step_ms, 3) for v in self.verify_ms]

    def round_ms(self, length: int, whole_block: bool = True) -> float:
        """A round that verifies `length` positions: its draft (none for length 1) and its verify.
        whole_block: the drafter drafted its whole block (auto); else only `length` (a fixed size)."""
        return self.verify_ms[length - 1] + self.draft_of(length, whole_block)

    def draft_of(self, length: int, whole_block: bool = False) -> float:
        """The draft of a round that verifies `length` positions: none for 1; the whole block's
        (whole_block, or no draft lengths measured); else a draft of `length`."""
        if length <= 1:
            return 0.0
        if whole_block or not self.draft_by_length_ms:
            return self.draft_ms or 0.0
        return self.draft_by_length_ms[length - 1]


def fitted(curve: CostCurve) -> CostCurve:
    """The curve with its verify and draft times made non-decreasing in length at every depth:
    timing noise on a loaded CPU can make a longer verify look cheaper than a shorter one,
    which tilts auto towards drafting.
    Work grows with length, so each depth's curve is the nearest non-decreasing one."""
    def fit(point: DepthPoint) -> DepthPoint:
        by_length = point.draft_by_length_ms
        if by_length:
            by_length = [by_length[0]] + non_decreasing(by_length[1:])
        return replace(point, verify_ms=non_decreasing(point.verify_ms), draft_by_length_ms=by_length)

    return with_points(curve, [fit(p) for p in curve.points()])


def shorter(curve: CostCurve, block: int) -> CostCurve:
    """A curve measured up to a longer block, cut to `block`: its verifies of 1..block and drafts of
    2..block at each depth are what a measurement up to `block` times (the same sweeps, the longer
    lengths after them). Its depths are the longer block's: near the target's context it may lack the
    deepest one a shorter block would fit (the curve holds its deepest figures beyond it)."""
    def cut(p: DepthPoint) -> DepthPoint:
        by_length = p.draft_by_length_ms[:block] if p.draft_by_length_ms is not None else None
        return replace(p, verify_ms=p.verify_ms[:block], draft_by_length_ms=by_length)

    return with_points(curve, [cut(p) for p in curve.points()], block=block)


def with_points(curve: CostCurve, points: list[DepthPoint], **changes) -> CostCurve:
    """`curve` with its depth points replaced by `points` (the first at the base depth)."""
    base, *deeper = points
    return replace(curve, ar_step_ms=base.ar_step_ms, verify_ms=base.verify_ms,
                   draft_by_length_ms=base.draft_by_length_ms,
                   draft_ms=base.draft_by_length_ms[-1] if base.draft_by_length_ms else curve.draft_ms,
                   deeper=deeper, **changes)


def non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit (pool adjacent violators): runs that fall are averaged."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [round(m, 4) for m, n in blocks for _ in range(int(n))]


@dataclass
class CurveStore:
    """Curves measured in this process, beside the on-disk cache (engine/decode/cost_curve.py). A
    loaded pair holds one (LoadedPair.curves): its runs find here what they cannot find on disk."""
    # by cache file: the cache folder could not take them (an unwritable cache costs one measurement
    # per pair loaded, not one per run)
    unwritten: dict[str, CostCurve] = field(default_factory=dict)
    stopped: dict[str, list[DepthPoint]] = field(default_factory=dict)  # by cache key: a stopped measurement's depths
    # by cache key: a sharded run's curves (rank 0's timings, agreed), measured once, not at every run's
    # start (a `bench` of 10 prompts measured it 20 times). Every rank runs the same commands in the same
    # order, so every rank finds a curve here, or measures it, at the same point.
    sharded: dict[str, CostCurve] = field(default_factory=dict)
