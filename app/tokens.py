"""Token text: a vocabulary table (id -> text) and the alignment of output tokens to streamed text.

The engine streams text per committed batch (TextEvent); a DFlash round commits
several tokens at once, and the detokenizer may hold a token back (a lone space,
half of a UTF-8 character). To colour each token by provenance the window needs
each token's span in the text: `SpanAligner` matches the table's piece for each
token against the streamed text, waits when text has not arrived yet, and falls
back to one shared span for a batch it cannot split (so the text shown is always
exactly the engine's).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

TokenTable = Sequence[str]


def build_token_table(tokenizer: Any, size: int) -> list[str]:
    """Text of each id decoded alone (special tokens kept). Runs where the tokenizer lives."""
    ids = [[i] for i in range(size)]
    batch = getattr(tokenizer, "batch_decode", None) or getattr(tokenizer, "decode_batch", None)
    if batch is not None:
        try:
            return list(batch(ids, skip_special_tokens=False))
        except Exception:  # a tokenizer without the batch API's keywords: one at a time below
            pass
    out = []
    for one in ids:
        try:
            out.append(tokenizer.decode(one, skip_special_tokens=False))
        except Exception:
            out.append("")
    return out


def table_from_tokenizer_json(folder: Optional[str]) -> Optional[list[str]]:
    """For replaying a trace without a model: the table from the target's tokenizer.json, if still there."""
    if not folder:
        return None
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
        return build_token_table(tok, tok.get_vocab_size(with_added_tokens=True))
    except Exception:
        return None


_VISIBLE = str.maketrans({" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"})


def chip_text(table: Optional[TokenTable], token_id: int, limit: int = 12) -> str:
    """Short, whitespace-visible text of a token for chips and tooltips."""
    piece = table[token_id] if table is not None and 0 <= token_id < len(table) else None
    if piece is None:
        return f"#{token_id}"
    if piece == "":
        return "∅"
    shown = piece.translate(_VISIBLE)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


@dataclass
class Span:
    """A run of output text drawn with the provenance of `tokens` (empty: text no token claims)."""

    start: int  # offsets in the run's whole output text
    end: int
    tokens: tuple[int, ...]
    text: str


class SpanAligner:
    """Assigns each output token a [start, end) span of the streamed text, in order.

    Keeps only the text no token has claimed yet, so a long run costs linear time.
    """

    def __init__(self, table: Optional[TokenTable]):
        self.table = table
        self.offset = 0  # where `buffer` starts in the whole text
        self.buffer = ""  # streamed text not yet given to a token
        self.pending: list[Any] = []  # OutToken-like: .index, .id, .start, .end

    def _piece(self, token_id: int) -> Optional[str]:
        if self.table is None or not 0 <= token_id < len(self.table):
            return None
        return self.table[token_id]

    @staticmethod
    def _match(piece: str, rest: str, at_start: bool) -> Optional[int]:
        """Characters of `rest` that the token covers, or None if it does not fit here."""
        if piece and rest.startswith(piece):
            return len(piece)
        core = piece.lstrip()
        if core and (core != piece or rest[:1].isspace()):
            # A leading space trimmed at the very start (BPE) or added before the token (SentencePiece).
            ws = len(rest) - len(rest.lstrip())
            if rest.startswith(core, ws) and (ws or at_start):
                return ws + len(core)
        return None

    def _take(self, n: int) -> str:
        text, self.buffer = self.buffer[:n], self.buffer[n:]
        self.offset += n
        return text

    def _place(self, tok: Any, n: int, spans: list[Span]) -> None:
        start = self.offset
        text = self._take(n)
        tok.start, tok.end = start, start + n
        if n:
            spans.append(Span(start, start + n, (tok.index,), text))

    def _share(self, spans: list[Span]) -> None:
        """The pending tokens share whatever text is left: a batch that cannot be split."""
        start, n = self.offset, len(self.buffer)
        for tok in self.pending:
            tok.start, tok.end = start, start + n
        if n:
            spans.append(Span(start, start + n, tuple(t.index for t in self.pending), self._take(n)))
        self.pending = []

    def feed(self, new_text: str, new_tokens: Sequence[Any], final: bool = False) -> list[Span]:
        """Add streamed text and the tokens it came with; returns the spans this completes."""
        self.buffer += new_text
        self.pending.extend(new_tokens)
        spans: list[Span] = []
        while self.pending:
            tok = self.pending[0]
            rest = self.buffer
            piece = self._piece(tok.id)
            if piece is None:
                if rest or final:
                    self._share(spans)
                break
            n = self._match(piece, rest, at_start=self.offset == 0)
            if n is not None:
                self.pending.pop(0)
                self._place(tok, n, spans)
                continue
            if not rest or piece.startswith(rest):
                if not final:
                    break  # its text has not been streamed yet (or never will be: EOS)
                self.pending.pop(0)
                self._place(tok, len(rest), spans)
                continue
            self._share(spans)
        if final:
            for tok in self.pending:  # nothing left to show for these (EOS, cut by a stop string)
                tok.start = tok.end = self.offset
            self.pending = []
            if self.buffer:
                start = self.offset
                spans.append(Span(start, start + len(self.buffer), (), self._take(len(self.buffer))))
        return spans
