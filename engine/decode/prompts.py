"""Prompt text to token ids, raw (as mlx-lm encodes a plain string) or through the chat template.

Through the chat template, a prompt is one user message, or a whole conversation when its text is
one: a JSON list of {"role", "content"} messages (OpenAI's chat format), so a chat history runs as
the model sees it in a chat (its earlier assistant turns and the template's markers between them),
not pasted into one message. A conversation that ends with an assistant message is continued (the
reply goes on from its text) rather than answered by a new turn.

A base model has no chat template, and a plain prompt to it is raw text. Its folder may still hold
a conversation template (CONVERSATION_TEMPLATE, as the demo target's): a layout for conversations
only (a JSON list of messages, the server's chat endpoints, --chat), so a plain prompt stays raw.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Optional

from engine.errors import SettingsError

# A base model's layout for conversations alone, a Jinja chat template in its folder (transformers
# loads chat_template.jinja as the chat template, which would make plain prompts chat: hence the name).
CONVERSATION_TEMPLATE = "conversation_template.jinja"
MAX_TEMPLATE_BYTES = 64 * 1024


class NoChatTemplate(SettingsError):
    """A conversation for a tokenizer with neither a chat template nor a conversation template."""


def conversation_template(tokenizer) -> Optional[str]:
    """The conversation template in the folder the tokenizer was loaded from, or None."""
    path = Path(str(tokenizer.name_or_path)) / CONVERSATION_TEMPLATE
    try:
        st = path.stat()
    except OSError:
        return None
    if not path.is_file() or st.st_size > MAX_TEMPLATE_BYTES:
        return None
    return _template_text(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _template_text(path: str, mtime_ns: int, size: int) -> str:
    """A template file's text, read once per version of the file (a server asks for it every request)."""
    return Path(path).read_text(encoding="utf-8")


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


def looks_like_conversation(text: str) -> bool:
    """Whether the text begins as a conversation would (a JSON list with "role" keys)."""
    stripped = text.strip()
    return stripped.startswith("[") and '"role"' in stripped


def conversation(text: str) -> Optional[list[dict[str, Any]]]:
    """The messages of a prompt written as a conversation (a JSON list of {"role", "content"} objects),
    or None for any other text. Text that begins as one but does not read as one is refused with
    where it went wrong: sent as one user message instead, it would be a silent surprise."""
    if not looks_like_conversation(text):
        return None
    stripped = text.strip()
    raw_hint = "; or encode the prompt raw (--raw, the window's Format raw) to send the text as it is."
    try:
        messages = json.loads(stripped)
    except ValueError as exc:
        raise SettingsError(f"the prompt reads as a conversation (a JSON list of messages) but is not valid JSON: "
                            f"{exc}{raw_hint}") from None
    problem = message_problem(messages)
    if problem is not None:
        raise SettingsError(problem + raw_hint)
    return messages


def message_problem(messages: Any) -> Optional[str]:
    """What keeps parsed JSON from being a conversation, or None when it is one."""
    if not isinstance(messages, list) or not messages:
        return "a conversation is a JSON list of one or more messages"
    for n, m in enumerate(messages, 1):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return (f"message {n} of the conversation needs a \"role\" and a \"content\", both text "
                    f"(as {{\"role\": \"user\", \"content\": \"...\"}})")
    return None


def encode_prompt(tokenizer, text: str, chat: Optional[bool] = None, thinking: Optional[bool] = None) -> list[int]:
    """chat=None uses the chat template when the tokenizer has one."""
    check_text(text)
    use_chat = tokenizer.has_chat_template if chat is None else chat
    if chat is None and not use_chat and looks_like_conversation(text):  # raw, it would be its JSON text
        if conversation_template(tokenizer) is None:
            raise NoChatTemplate("the prompt is a conversation (a JSON list of messages) and this tokenizer has no "
                                 "chat template to write it as the model's text; encode it raw (--raw, the "
                                 "window's Format raw) to send the JSON as it is.")
        use_chat = True
    if thinking is not None and not use_chat:  # it was silently dropped
        raise SettingsError("thinking on/off is an option of the chat template, and this prompt is encoded as "
                            + ("raw text" if chat is False else "raw text (this tokenizer has no chat template)")
                            + "; leave thinking unset.")
    if use_chat:
        return encode_messages(tokenizer, conversation(text) or [{"role": "user", "content": text}], thinking)
    bos = tokenizer.bos_token
    add_special = bos is None or not text.startswith(bos)
    return list(tokenizer.encode(text, add_special_tokens=add_special))


def encode_messages(tokenizer, messages: list[dict[str, Any]], thinking: Optional[bool] = None) -> list[int]:
    """A conversation (checked: see message_problem) through the chat template, else the folder's
    conversation template; NoChatTemplate when there is neither."""
    kwargs: dict[str, Any] = {} if thinking is None else {"enable_thinking": thinking}
    if not tokenizer.has_chat_template:
        template = conversation_template(tokenizer)
        if template is None:
            raise NoChatTemplate("this tokenizer has no chat template; use raw mode (--raw).")
        kwargs["chat_template"] = template
    if messages[-1]["role"] == "assistant":  # the reply goes on from the assistant's text
        kwargs["continue_final_message"] = True
    else:
        kwargs["add_generation_prompt"] = True
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return list(tokenizer.encode(text, add_special_tokens=False))
