"""OpenAI's wire format: chat and text completions, whole and as chunks, with usage."""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional

from engine.decode.events import SummaryEvent
from engine.serve import figures

FINISH = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "cancelled": "stop"}


class Reply:
    """The fixed parts of one response: id, time, model, and whether it is a chat or a text completion."""

    def __init__(self, model: str, chat: bool):
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, text: str, finish: Optional[str], chunk: bool, first: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if chunk:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None, "finish_reason": finish}

    def whole(self, summary: SummaryEvent, spec: dict[str, Any]) -> dict[str, Any]:
        """`spec`: the speculative figures (figures.speculative), in their extra field."""
        return {**self._head(False), "choices": [self._choice(summary.text, FINISH[summary.stop_reason], False)],
                "usage": usage(summary), figures.FIELD: spec}

    def chunk(self, text: str, include_usage: bool, first: bool = False) -> dict[str, Any]:
        out = {**self._head(True), "choices": [self._choice(text, None, True, first)]}
        return {**out, "usage": None} if include_usage else out

    def last_chunk(self, summary: SummaryEvent, include_usage: bool, spec: dict[str, Any]) -> dict[str, Any]:
        """The chunk with finish_reason (and the speculative figures)."""
        out = {**self._head(True), "choices": [self._choice("", FINISH[summary.stop_reason], True)],
               figures.FIELD: spec}
        return {**out, "usage": None} if include_usage else out

    def usage_chunk(self, summary: SummaryEvent) -> dict[str, Any]:
        """stream_options.include_usage: a last chunk with usage and no choices."""
        return {**self._head(True), "choices": [], "usage": usage(summary)}


def usage(summary: SummaryEvent) -> dict[str, Any]:
    return {"prompt_tokens": summary.prompt_tokens, "completion_tokens": summary.num_generated,
            "total_tokens": summary.prompt_tokens + summary.num_generated,
            "prompt_tokens_details": {"cached_tokens": summary.reused_tokens}}


def models_list(model_id: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                        "owned_by": "dflash-playground"}]}
