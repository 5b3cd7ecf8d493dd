"""A checked request to what the decode thread runs: prompt ids and generation settings.

Everything here happens before the request joins the queue, so a prompt past the target's
context or a setting the pair refuses is a 400 at once, never an error inside a stream.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Optional

from engine.decode.prefill import check_prompt, context_length
from engine.decode.prompts import NoChatTemplate, encode_messages, encode_prompt
from engine.decode.settings import GenerationSettings, SamplingSettings
from engine.errors import SettingsError
from engine.models.pair import LoadedPair
from engine.serve.defaults import DEFAULT_MAX_TOKENS
from engine.serve.errors import ApiError
from engine.serve.requests import Sampling


@dataclass(frozen=True)
class ServeConfig:
    """How the server runs every request: the command's settings (mode, block size, lookup, ...)."""
    base: GenerationSettings
    model_id: str  # what /v1/models lists and a response names when the request gave no model
    default_max_tokens: int = DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class Prepared:
    prompt_ids: list[int]
    settings: GenerationSettings
    model: str  # echoed


def chat_ids(pair: LoadedPair, messages: list[dict[str, str]]) -> list[int]:
    """A conversation as the model's text; a model with no layout for one is refused naming the way out."""
    try:
        return encode_messages(pair.tokenizer, messages)
    except NoChatTemplate:
        raise ApiError(400, "this model has no chat template (nor a conversation template), so a conversation has "
                            "no layout to write it in; send the text as it is to /v1/completions.",
                       "messages") from None


def completion_ids(pair: LoadedPair, prompt: str) -> list[int]:
    return encode_prompt(pair.tokenizer, prompt, chat=False)


def prepare(pair: LoadedPair, config: ServeConfig, request: Sampling, prompt_ids: list[int],
            stop: list[str], max_tokens: Optional[int]) -> Prepared:
    """The settings of one run, checked against the pair and the prompt against the context."""
    base = config.base.sampling
    temperature = base.temperature if request.temperature is None else request.temperature
    seed = request.seed
    if seed is None:  # as OpenAI's: no seed, another sample each time (generate's 0 makes them all alike)
        seed = base.seed if temperature == 0 else secrets.randbelow(2**63)
    sampling = SamplingSettings(
        temperature=temperature,
        top_p=base.top_p if request.top_p is None else request.top_p,
        top_k=base.top_k if request.top_k is None else request.top_k,
        min_p=base.min_p if request.min_p is None else request.min_p,
        seed=seed,
    )
    if max_tokens is None:
        room = (context_length(pair) or 0) - len(prompt_ids)
        max_tokens = min(config.default_max_tokens, room) if room > 0 else config.default_max_tokens
    settings = replace(config.base, sampling=sampling, max_tokens=max_tokens, stop_strings=tuple(stop or ()))
    try:
        settings = settings.resolved(pair)
        check_prompt(pair, prompt_ids, settings.max_tokens)
    except SettingsError as exc:
        raise ApiError(400, str(exc)) from None
    return Prepared(prompt_ids, settings, request.model or config.model_id)
