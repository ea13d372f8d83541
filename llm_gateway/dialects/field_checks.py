"""Checks of JSON request fields for the ingress dialects, each failing with the dialect's 400.

Each check takes the value and its dotted parameter path and returns the value typed, or raises
`InvalidRequest` naming the parameter with pydantic-style wording ("Input should be a valid
integer"), which is what Anthropic's API answers for the same mistakes. A hint is a field that is
checked for its type or allowed values and then ignored.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.errors import InvalidRequest

#: a JSON type name, or the string values allowed; null is always allowed
Hint = str | tuple[str, ...]
JSON_TYPES: dict[str, type | tuple[type, ...]] = {"object": dict, "string": str, "boolean": bool, "array": list}


def bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def as_int(value: Any, param: str, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 16.0 is the integer 16 in JSON (and in its Schema)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad("Input should be a valid integer", param)
    if value >= 2**63:
        raise bad("Input should be a 64-bit integer", param)
    if value < minimum:
        raise bad(f"Input should be greater than or equal to {minimum}", param)
    return value


def as_number(value: Any, param: str, low: float, high: float | None) -> float | int:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad("Input should be a valid number", param)
    if value < low or (high is not None and value > high):
        raise bad(f"Input should be between {low:g} and {high:g}" if high is not None else f">= {low:g}", param)
    return value


def as_bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise bad("Input should be a valid boolean", param)
    return value


def as_str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise bad("Input should be a valid string", param)
    return value


def as_obj(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad("Input should be a valid dictionary or object", param)
    return value


def as_list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise bad("Input should be a valid list", param)
    return value


def check_hint(value: Any, param: str, hint: Hint) -> None:
    """A hint is checked for its type or values, then ignored."""
    if value is None:
        return
    if isinstance(hint, tuple):
        if not isinstance(value, str) or value not in hint:
            raise bad("Input should be " + " or ".join(f"'{v}'" for v in hint), param)
    elif not isinstance(value, JSON_TYPES[hint]):
        raise bad(f"Input should be a valid {hint}", param)


def only_fields(obj: dict[str, Any], allowed: frozenset[str], param: str) -> None:
    for k in obj:
        if k not in allowed:
            raise bad("Extra inputs are not permitted", f"{param}.{k}")


class PromptChars:
    """Characters of prompt text seen, for the estimate."""

    __slots__ = ("chars",)

    def __init__(self) -> None:
        self.chars = 0
