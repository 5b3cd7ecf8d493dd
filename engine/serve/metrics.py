"""GET /metrics: Prometheus counters, named as vLLM names its own (dflash: for vllm:).

Speculative decoding as vLLM counts it: drafts (rounds that verified drafted tokens), draft
tokens, accepted tokens, and both per draft position, so a dashboard built for vLLM reads ours.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import disable_created_metrics

from engine.decode.events import RoundEvent, SummaryEvent
from engine.serve.engine_queue import NotRun

disable_created_metrics()  # a *_created series per counter doubles the page and no dashboard reads it
PREFIX = "dflash:"
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The server's counters, in a registry of their own (two servers in one process do not mix)."""

    def __init__(self, running, waiting):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}request_success", "Requests finished, by why they ended.",
                                ["finished_reason"], registry=r)
        self.refused = Counter(f"{PREFIX}request_refused", "Requests refused, by HTTP status.", ["status"],
                               registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens of finished runs.", registry=r)
        self.cached_tokens = Counter(f"{PREFIX}prefix_cache_hits", "Prompt tokens taken from a kept prefix.",
                                     registry=r)
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens", "Tokens generated.", registry=r)
        self.drafts = Counter(f"{PREFIX}spec_decode_num_drafts", "Rounds that verified drafted tokens.", registry=r)
        self.draft_tokens = Counter(f"{PREFIX}spec_decode_num_draft_tokens", "Drafted tokens verified.", registry=r)
        self.accepted_tokens = Counter(f"{PREFIX}spec_decode_num_accepted_tokens", "Drafted tokens accepted.",
                                       registry=r)
        self.accepted_per_pos = Counter(f"{PREFIX}spec_decode_num_accepted_tokens_per_pos",
                                        "Drafted tokens accepted, by position in the draft (0 first).",
                                        ["position"], registry=r)
        self.drafted_per_pos = Counter(f"{PREFIX}spec_decode_num_draft_tokens_per_pos",
                                       "Drafted tokens verified, by position in the draft (0 first).",
                                       ["position"], registry=r)
        self._drafted: list = []  # children of drafted_per_pos and accepted_per_pos, by position
        self._accepted: list = []
        self.tok_per_s = Histogram(f"{PREFIX}request_decode_tokens_per_second", "A run's decode speed.",
                                   buckets=(10, 25, 50, 100, 200, 400, 800, 1600, 3200), registry=r)
        Gauge(f"{PREFIX}num_requests_running", "Runs on the decode thread.", registry=r).set_function(running)
        Gauge(f"{PREFIX}num_requests_waiting", "Runs queued for it.", registry=r).set_function(waiting)

    def observe(self, event) -> None:
        if isinstance(event, RoundEvent) and event.drafted:
            n, accepted = len(event.drafted), event.accepted
            self.drafts.inc()
            self.draft_tokens.inc(n)
            self.accepted_tokens.inc(accepted)
            drafted, taken = self._per_position(n)
            for pos in range(n):
                drafted[pos].inc()
                if pos < accepted:
                    taken[pos].inc()
        elif isinstance(event, NotRun) and event.cancelled:  # its client left before its turn came
            self.requests.labels("cancelled").inc()
        elif isinstance(event, SummaryEvent):
            self.requests.labels(event.stop_reason).inc()
            self.prompt_tokens.inc(event.prompt_tokens)
            self.cached_tokens.inc(event.reused_tokens)
            self.generation_tokens.inc(event.num_generated)
            if event.timed:
                self.tok_per_s.observe(event.tok_per_s)

    def _per_position(self, n: int) -> tuple[list, list]:
        """The per-position counters' children for positions 0..n-1, looked up once per position a
        server ever drafts, not once per round."""
        while len(self._drafted) < n:
            pos = str(len(self._drafted))
            self._drafted.append(self.drafted_per_pos.labels(pos))
            self._accepted.append(self.accepted_per_pos.labels(pos))
        return self._drafted, self._accepted

    def text(self) -> bytes:
        return generate_latest(self.registry)
