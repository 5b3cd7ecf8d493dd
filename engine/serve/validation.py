"""A pydantic validation failure as one line a person can act on, naming the field."""

from __future__ import annotations

from typing import Any, Optional


def _field(loc) -> str:
    """`messages[0].content` from pydantic's location, without the union branches it tried."""
    out = ""
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or "(" in part or part in ("str", "list", "int", "float", "bool", "dict"):
            continue  # a branch of a union ("str", "function-after[...]"), not a field
        else:
            out += ("." if out else "") + part
    return out


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, Optional[str]]:
    """(message, param) for the first error, as FastAPI reports a body its model refused."""
    if not errors:
        return "the request body was refused.", None
    err = errors[0]
    kind, name = err.get("type", ""), _field(err.get("loc", ()))
    if kind == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON ({detail}).", None
    if kind == "missing" and not name:
        return "the request has no JSON body; send one with Content-Type: application/json.", None
    if kind in ("model_attributes_type", "dict_type", "model_type") and not name:
        return "the request body must be a JSON object.", None
    if kind == "extra_forbidden":
        return f"unrecognized request argument '{name}': this server does not take it; leave it out.", name
    if kind == "missing":
        return f"'{name}' is required.", name
    message = str(err.get("msg", "is not valid")).removeprefix("Value error, ")
    return (f"{name}: {message}" if name else message).rstrip(".") + ".", name or None
