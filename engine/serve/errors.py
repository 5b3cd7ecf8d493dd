"""An HTTP error with its status, in the shape the client's API uses (OpenAI's or Anthropic's)."""

from __future__ import annotations

from typing import Any, Optional

from engine.errors import DFlashError

# OpenAI's error `type` by status (as vLLM and llama.cpp answer them), and Anthropic's.
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                500: "server_error", 503: "server_error"}
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                   405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 503: "overloaded_error"}


class ApiError(DFlashError):
    """A request refused with `status` and a one-line message (`param`: the field at fault)."""

    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())  # one line, whatever it quotes
        self.param = param
        self.headers = headers or {}


def error_body(status: int, message: str, param: Optional[str], anthropic: bool) -> dict[str, Any]:
    """The JSON body of an error: Anthropic's shape on its endpoint, OpenAI's everywhere else."""
    if anthropic:
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    kind = OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
