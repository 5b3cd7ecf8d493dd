"""Where the output ends: one committed token at a time, so AR and DFlash end identically."""

from __future__ import annotations

from typing import Iterable

from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer


class OutputTracker:
    """Appends tokens, streams text, and stops at EOS, max tokens or a stop string.

    The text is the tokenizer's own decode of the tokens. mlx-lm's faster BPE and SentencePiece
    streaming detokenizers drop a space at the very start of the output, which suits a chat reply
    but not a continuation: `def f():\n` + `"   "` + `' return'` would show three spaces of indent.
    """

    def __init__(self, tokenizer, max_tokens: int, stop_strings: Iterable[str] = ()):
        self.detok = NaiveStreamingDetokenizer(tokenizer)
        self.eos_ids = set(tokenizer.eos_token_ids)
        self.max_tokens = max_tokens
        self.stop_strings = [s for s in stop_strings if s]
        self.tokens: list[int] = []
        self.stop_reason: str | None = None
        self._emitted = 0
        self._cut: int | None = None  # text length where a stop string begins
        self._finished = False

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def add(self, token: int) -> bool:
        """Commit one token; True when generation must stop after it."""
        self.tokens.append(token)
        if token in self.eos_ids:
            self.stop_reason = "eos"
            return True
        self.detok.add_token(token)
        if self.stop_strings:
            text = self.detok.text
            hits = [text.find(s) for s in self.stop_strings if s in text]
            if hits:
                self._cut = min(hits)
                self.stop_reason = "stop_string"
                return True
        if len(self.tokens) >= self.max_tokens:
            self.stop_reason = "max_tokens"
            return True
        return False

    def add_many(self, tokens: Iterable[int]) -> tuple[list[int], bool]:
        """Commit tokens in order until one stops the output; return those kept."""
        kept = []
        for t in tokens:
            kept.append(t)
            if self.add(t):
                return kept, True
        return kept, False

    def finish(self) -> None:
        self.detok.finalize()
        self._finished = True

    @property
    def text(self) -> str:
        text = self.detok.text
        return text if self._cut is None else text[: self._cut]

    def take_delta(self) -> str:
        """Text that appeared since the last call, less an end that may begin a stop string.

        While the output goes on, text ending in the first characters of a stop string is held back
        until the next tokens complete the stop (and the summary cuts it) or rule it out, so the
        stream never shows what the summary cuts. The run's end (a stop, or `finish`) releases it.
        """
        text = self.text
        end = len(text)
        if self.stop_reason is None and not self._finished:
            end -= self._pending_stop(text)
        delta = text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return delta

    def _pending_stop(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string begins with."""
        longest = 0
        for stop in self.stop_strings:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
