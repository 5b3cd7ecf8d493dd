"""Prompt text to token ids, raw (as mlx-lm encodes a plain string) or through the chat template."""

from __future__ import annotations

import re
from typing import Optional

from engine.errors import SettingsError

# How a prompt is encoded, by name (CLI flags, the window's Format, trace headers) -> the `chat` flag.
PROMPT_FORMATS: dict[str, Optional[bool]] = {"auto": None, "chat": True, "raw": False}


def format_name(chat: Optional[bool]) -> str:
    return next(name for name, flag in PROMPT_FORMATS.items() if flag is chat)


# A lone surrogate: no tokenizer encodes one. Python decodes argv bytes that are not UTF-8 into them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str) -> None:
    """Refuse a prompt no tokenizer can encode, saying which character and where."""
    found = _SURROGATE.search(text)
    if found is not None:
        raise SettingsError(f"the prompt holds a lone surrogate U+{ord(found.group()):04X} at character "
                            f"{found.start()} (counting from 0), which is not text a tokenizer can encode; "
                            "remove it or give the prompt as UTF-8.")


def encode_prompt(tokenizer, text: str, chat: Optional[bool] = None, thinking: Optional[bool] = None) -> list[int]:
    """chat=None uses the chat template when the tokenizer has one."""
    check_text(text)
    use_chat = tokenizer.has_chat_template if chat is None else chat
    if thinking is not None and not use_chat:  # it was silently dropped
        raise SettingsError("thinking on/off is an option of the chat template, and this prompt is encoded as "
                            + ("raw text" if chat is False else "raw text (this tokenizer has no chat template)")
                            + "; leave thinking unset.")
    if use_chat:
        if not tokenizer.has_chat_template:
            raise SettingsError("this tokenizer has no chat template; use raw mode (--raw).")
        kwargs = {} if thinking is None else {"enable_thinking": thinking}
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True, **kwargs
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    bos = tokenizer.bos_token
    add_special = bos is None or not text.startswith(bos)
    return list(tokenizer.encode(text, add_special_tokens=add_special))
