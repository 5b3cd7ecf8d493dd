"""Anthropic's Messages wire format: the whole message, and its stream of named events."""

from __future__ import annotations

import uuid
from typing import Any, Optional

from engine.decode.events import SummaryEvent
from engine.serve import figures

STOP = {"eos": "end_turn", "stop_string": "stop_sequence", "max_tokens": "max_tokens", "cancelled": "end_turn"}


class Message:
    def __init__(self, model: str, prompt_tokens: int):
        self.id = "msg_" + uuid.uuid4().hex
        self.model = model
        self.prompt_tokens = prompt_tokens

    def _usage(self, summary: Optional[SummaryEvent]) -> dict[str, Any]:
        cached = summary.reused_tokens if summary else 0
        return {"input_tokens": self.prompt_tokens - cached, "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0, "output_tokens": summary.num_generated if summary else 0}

    def whole(self, summary: SummaryEvent, stop: Optional[str], spec: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": summary.text}], "stop_reason": STOP[summary.stop_reason],
                "stop_sequence": stop, "usage": self._usage(summary), figures.FIELD: spec}

    def start_events(self) -> str:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": self._usage(None)}
        return (figures.sse({"type": "message_start", "message": message}, "message_start")
                + figures.sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                              "content_block_start"))

    @staticmethod
    def delta_event(text: str) -> str:
        return figures.sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
                           "content_block_delta")

    def end_events(self, summary: SummaryEvent, stop: Optional[str], spec: dict[str, Any]) -> str:
        delta = {"type": "message_delta", "delta": {"stop_reason": STOP[summary.stop_reason], "stop_sequence": stop},
                 "usage": self._usage(summary), figures.FIELD: spec}
        return (figures.sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
                + figures.sse(delta, "message_delta") + figures.sse({"type": "message_stop"}, "message_stop"))
