"""What an adapter does with each field of OpenAI's request: the shared table type, its checker and its 400.

Each OpenAI-speaking adapter declares, for every field of OpenAI's chat and completions requests (the
openai SDK's own `CompletionCreateParams`; tests/unit/test_field_tables.py holds every table to the
installed SDK's list), one `FieldRule`: PASSED to the engine as it is (and the engine honours it: the
adapter cites where), TRANSLATED (renamed or rewritten for the engine), GATEWAY (the gateway acts on
it), HINT (cannot change the answer: accepted, harmless to send), or REFUSED (the engine would accept
and ignore it, or cannot honour it). A field the engine accepts but ignores counts as dropped, so it
is refused, except for the values that ask nothing (`logit_bias: {}`, `n: 1`): a rule's `accepted`.

`FieldTable.check` runs before the engine is called: one dict lookup per body key, against tables
built once per adapter class; the first field with a value the engine cannot honour is a 400
`unsupported_parameter` whose `param` is the field and whose message names the field and the engine.
Fields not in OpenAI's request (an engine's native extras: vLLM's `top_k`, `chat_template_kwargs`)
are not looked at: they pass through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from llm_gateway.errors import InvalidRequest

PASSED, TRANSLATED, GATEWAY, HINT, REFUSED = "passed", "translated", "gateway", "hint", "refused"
#: every `how` a rule may have: a test hook (tests/unit/test_field_tables.py checks each table's rules against it)
HOWS = frozenset({PASSED, TRANSLATED, GATEWAY, HINT, REFUSED})


@dataclass(frozen=True, slots=True)
class FieldRule:
    """What becomes of one OpenAI request field on one engine."""

    how: str
    #: where the engine honours it (file@commit or capture), or why it is refused
    why: str
    #: the only values accepted (each one asks nothing of the engine, or the engine honours it); any other
    #: value is refused. None: every value is accepted (the engine answers for the value itself)
    accepted: tuple[Any, ...] | None = None


def passed(why: str, *, accepted: tuple[Any, ...] | None = None) -> FieldRule:
    return FieldRule(PASSED, why, accepted)


def translated(why: str, *, accepted: tuple[Any, ...] | None = None) -> FieldRule:
    return FieldRule(TRANSLATED, why, accepted)


def gateway(why: str) -> FieldRule:
    return FieldRule(GATEWAY, why)


def hint(why: str) -> FieldRule:
    return FieldRule(HINT, why)


def refused(why: str, *harmless: Any) -> FieldRule:
    """Refused unless its value is None or one of `harmless` (values that ask nothing of the engine)."""
    return FieldRule(REFUSED, why, (None, *harmless))


#: OpenAI-only fields that no local engine here acts on, and that cannot change the answer
HINTS: Mapping[str, FieldRule] = MappingProxyType(
    {
        "user": hint("an end-user id for OpenAI's abuse monitoring"),
        "safety_identifier": hint("an end-user id for OpenAI's abuse monitoring"),
        "metadata": hint("tags for OpenAI's stored completions"),
        "store": hint("OpenAI's storage for distillation and evals"),
        "service_tier": hint("OpenAI's processing tier"),
        "prompt_cache_key": hint("OpenAI's prompt-cache routing (the engine caches prefixes itself)"),
        "prompt_cache_retention": hint("OpenAI's prompt-cache lifetime"),
        "prompt_cache_options": hint("OpenAI's prompt-cache breakpoints"),
        "prediction": hint("Predicted Outputs: a latency optimisation, the answer is the same"),
    }
)
#: OpenAI-only chat fields that change the answer and that no engine here reads (each adapter says so)
OPENAI_ONLY: Mapping[str, FieldRule] = MappingProxyType(
    {
        "functions": refused("OpenAI's deprecated function calling: send tools", []),
        "function_call": refused("OpenAI's deprecated function calling: send tool_choice", "auto", "none"),
        "audio": refused("audio output is not generated"),
        "modalities": refused("text output only", ["text"]),
        "web_search_options": refused("no web search"),
        "moderation": refused("the gateway runs no moderation"),
        "verbosity": refused("no verbosity control (only 'medium', OpenAI's default)", "medium"),
    }
)
#: the fields the gateway itself settles on every OpenAI-compatible engine (openai_compat.build)
GATEWAY_FIELDS: Mapping[str, FieldRule] = MappingProxyType(
    {
        "model": gateway("the deployment's upstream model name"),
        "stream_options": gateway("include_usage set for streams (the usage chunk); the rest sent as it is"),
    }
)


class FieldTable:
    """An engine's chat and completions field tables, and the check of a body against them."""

    __slots__ = ("_limits", "engine", "tables")

    def __init__(self, engine: str, chat: Mapping[str, FieldRule], completions: Mapping[str, FieldRule]) -> None:
        self.engine = engine
        self.tables: Mapping[str, Mapping[str, FieldRule]] = MappingProxyType(
            {"chat": MappingProxyType(dict(chat)), "completions": MappingProxyType(dict(completions))}
        )
        #: per endpoint, only the fields whose values are limited: the hot path looks up nothing else
        self._limits: dict[str, dict[str, FieldRule]] = {
            ep: {k: r for k, r in t.items() if r.accepted is not None} for ep, t in self.tables.items()
        }

    def check(self, endpoint: str, body: Mapping[str, Any]) -> None:
        """Raise the 400 for the first field of `body` whose value the engine cannot honour."""
        limits = self._limits.get(endpoint)
        if not limits or not limits.keys() & body.keys():  # the usual body has none of them: one set op in C
            return
        for k, v in body.items():  # in the body's order: its first bad field is the one named
            rule = limits.get(k)
            if rule is not None and rule.accepted is not None and not _among(v, rule.accepted):
                raise unsupported(k, self.engine, rule.why)


def _among(value: Any, accepted: tuple[Any, ...]) -> bool:
    """`value` is one of `accepted`, types kept apart (True is not 1, 0 is not False)."""
    return any(value == a and type(value) is type(a) for a in accepted)


def unsupported(field: str, engine: str, why: str) -> InvalidRequest:
    """The 400 for a field (or a value of it) that the engine behind this model cannot honour."""
    return InvalidRequest(
        f"'{field}' is not supported by the {engine} backend serving this model: {why}",
        param=field,
        code="unsupported_parameter",
    )


#: chat's token limit: `build()` sends both names, as engines read one or the other
TOKEN_LIMIT = translated("sent as both max_tokens and max_completion_tokens (engines read one or the other)")


def chat_fields(engine: Mapping[str, FieldRule]) -> dict[str, FieldRule]:
    """A chat table: the gateway's fields, OpenAI's hints and OpenAI-only fields, then the engine's own."""
    return {
        **GATEWAY_FIELDS,
        **HINTS,
        **OPENAI_ONLY,
        "max_tokens": TOKEN_LIMIT,
        "max_completion_tokens": TOKEN_LIMIT,
        **engine,
    }


def completions_fields(engine: Mapping[str, FieldRule]) -> dict[str, FieldRule]:
    """A completions table: the gateway's fields and `user`, then the engine's own."""
    return {**GATEWAY_FIELDS, "user": HINTS["user"], **engine}
