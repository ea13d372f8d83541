"""Reading an OpenAI request body for what the gateway itself needs, without re-validating it whole.

The body is parsed once (orjson) into a dict that is passed on; only the fields that routing,
limits and error messages need are checked here: `model`, `stream`, the endpoint's required field,
the capabilities the request calls for (vision, tools, json_schema), a token estimate for rate
limits, a lower bound of the prompt's tokens for the context-window fit check (`prompt_floor`), and
the affinity key for prefix-aware routing. Everything else passes through to the engine. Chat messages are sized
in one pass that gathers their texts and other fields (`Gathered`), summed in C; a translation that builds a chat
body (the Anthropic and Responses ones) gathers them as it builds its messages (and encodes its tools once), and
read_request takes its `Gathered` instead of walking them (or encoding the tools) again.

The two token numbers differ on purpose. `prompt_tokens` (characters / 4, plus a little per message
and image; tool definitions, tool calls and the other fields a template renders counted by their JSON
bytes, already measured for the ceiling) is a typical count, for reservations that are settled later and
for the token-count routes' estimate when no engine tokenizer answers. `prompt_floor` is what the
prompt's text cannot be less than under any tokenizer in use: its UTF-8 bytes that are not blanks,
at most `FLOOR_BYTES_PER_TOKEN` (8) a token (prose runs 3 to 5 bytes a token, CJK 2 to 4, code and
base64 less; vocabularies hold long runs of blanks as one token), with chat templates, images, tools
and tool-call arguments not counted at all, and for a batch (a list of prompts or inputs) the
largest one. A request is refused for its size only when even this floor does not fit, so the
gateway never refuses what the engine would take.

`prompt_ceiling` (chat only: the one body the engines' tokenizers count) is what the prompt cannot
exceed: every tokenizer in use (byte-level BPE; SentencePiece with byte fallback) emits at most one
token per UTF-8 byte of text, so the ceiling is the bytes of everything a chat template renders (the
texts, other message fields, tool calls and tools as JSON), plus `CEILING_BASE` tokens for the
template's own text (BOS, generation prompt, a default system prompt), `CEILING_PER_MESSAGE` for each
message's role markers, `CEILING_TOOLS` for a template's tool instructions and `CEILING_PER_IMAGE` for
each image (Qwen2-VL's default maximum, the largest in common use). A window between the floor and the
ceiling is ambiguous: prompt_count.py then asks the engine for the exact count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.gathered import CEILING_TOOLS, Gathered, messages_sums
from llm_gateway.wire import body_json

REQUIRED = {"chat": "messages", "completions": "prompt", "embeddings": "input"}
MAX_CHOICES = 1 << 20
FORMAT_SEP = "@"


@dataclass(slots=True)
class RequestInfo:
    model: str  # as asked, without a format suffix
    format: str | None
    stream: bool
    wants_usage: bool
    needs: frozenset[str]
    prompt_tokens: int  # estimate
    max_tokens: int | None
    affinity_text: str
    #: `prompt_floor` as far as summed (see there)
    floor_summed: int = 0
    #: an upper bound of the prompt's tokens (chat); None where the gateway cannot count the prompt exactly
    #: (other endpoints, or a request asking the engine to cut its prompt): decided on the floor alone
    prompt_ceiling: int | None = None
    #: the prompt's tokens by an engine's own tokenizer, per public model, where one was counted
    #: (prompt_count.py): the fit is decided on it rather than on the floor
    prompt_exact: dict[str, int] | None = None
    #: how many completions of up to `max_tokens` each the request generates: `n` (or completions'
    #: `best_of`, the larger) times the prompts of a completions batch; what a reservation multiplies
    choices: int = 1
    #: for cache-aware routing (prefix_cache.py), references to what the body already holds: the chat
    #: messages (or the completions prompt), the tools' JSON as measured here, and whether the conversation
    #: is new (no assistant or tool turn yet); `blocks` caches its hashed blocks across retries
    conversation: Any = None
    tools_json: bytes = b""
    fresh: bool = False
    blocks: Any = None

    #: the texts whose floors `prompt_floor` has yet to add (chat): a pass over every byte of the prompt,
    #: done only where a window is near enough for the floor to matter (issue 36: most of reading a 74 KB
    #: agent request was this pass, and a window above the ceiling never needs it)
    floor_texts: Sequence[str] = field(default=(), repr=False)

    @property
    def prompt_floor(self) -> int:
        """A lower bound of the prompt's tokens (of the largest prompt of a batch); 0 when the request asks
        the engine to cut its prompt (`truncate_prompt_tokens`). Never above `prompt_ceiling`."""
        if self.floor_texts:
            self.floor_summed += sum(_bounds(t)[0] for t in self.floor_texts)
            self.floor_texts = ()
        return self.floor_summed

    @prompt_floor.setter
    def prompt_floor(self, value: int) -> None:
        self.floor_summed, self.floor_texts = value, ()


def read_request(endpoint: str, body: dict[str, Any], gathered: Gathered | None = None) -> RequestInfo:
    """`gathered`: what the translation that built a chat body gathered of its messages as it built them (see
    `Gathered`), where it did: its sums stand for a pass over them."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("you must provide a model parameter (a non-empty string)", param="model")
    fmt: str | None = None
    if FORMAT_SEP in model:
        model, _, fmt = model.rpartition(FORMAT_SEP)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    req = REQUIRED[endpoint]
    value = body.get(req)
    if value is None:
        raise InvalidRequest(f"'{req}' is a required property", param=req)
    needs: set[str] = {endpoint}
    wants_usage = False
    if stream:
        if endpoint == "embeddings":
            raise InvalidRequest("embeddings cannot be streamed", param="stream")
        so = body.get("stream_options")
        if so is not None and not isinstance(so, dict):
            raise InvalidRequest("'stream_options' must be an object", param="stream_options")
        wants_usage = bool(so and so.get("include_usage") is True)
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if isinstance(v, float) and v.is_integer() and 0 <= v < 2**63:
            body[key] = int(v)  # 287.0 is the integer 287 in JSON (and its Schema): engines get the int form
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:  # null is absent: the engines then read max_tokens, and so does the reservation
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0):
        raise InvalidRequest("'max_tokens' must be a non-negative integer", param="max_tokens")
    ceiling: int | None = None
    tools_json = b""
    fresh = False
    texts: list[str] = []
    if endpoint == "chat":
        if gathered is not None and isinstance(value, list) and value:
            chars, affinity, texts, ceiling, fresh = gathered.sums(len(value), needs)
        else:
            chars, affinity, texts, ceiling, fresh = messages_sums(value, needs)
        floor = 0
        tools = body.get("tools") or body.get("functions")
        if tools:
            needs.add("tools")
            # what the template renders of them, counted in the estimate too (a translation's own encoding of them)
            tools_json = (
                (gathered.tools_json if gathered is not None else b"")
                or body_json.tools_json(tools)  # the kept JSON of an agent's resent tools (wire/body_json.py)
                or orjson.dumps(tools)
            )
            size = len(tools_json)
            chars += size
            ceiling += CEILING_TOOLS + size
        if body.get("chat_template_kwargs") is not None:
            ceiling += len(orjson.dumps(body["chat_template_kwargs"]))
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_schema":
            needs.add("json_schema")
    elif endpoint == "completions":
        chars, affinity, floor = _text_size(value, "prompt"), _prefix_text(value), _largest_floor(value)
    else:
        chars, affinity, floor = _text_size(value, "input"), "", _largest_floor(value)
    if body.get("truncate_prompt_tokens") is not None:
        floor, ceiling, texts = 0, None, []  # vLLM cuts the prompt to fit: its length is no reason to refuse
    choices = max(_count(body.get("n")), _count(body.get("best_of")))
    if endpoint == "completions" and isinstance(value, list) and value and not isinstance(value[0], int):
        choices *= len(value)  # a batch of prompts (strings or token lists): each one gets its completions
    return RequestInfo(
        model,
        fmt,
        stream,
        wants_usage,
        frozenset(needs),
        chars // 4 + 1,
        max_tokens,
        affinity,
        floor,
        ceiling,
        choices=choices,
        conversation=value,
        tools_json=tools_json,
        fresh=fresh,
        floor_texts=texts,
    )


def _count(v: Any) -> int:
    """`n` or `best_of` as a count of choices: 1 unless a positive integer (a wrong type is the engine's 400),
    at most `MAX_CHOICES` (past it, the reservation is already more than any budget or window holds)."""
    return min(v, MAX_CHOICES) if isinstance(v, int) and not isinstance(v, bool) and v > 1 else 1


def cap_output(endpoint: str, body: dict[str, Any], cap: int) -> None:
    """Hold the engine to `cap` output tokens per choice, in the gateway's copy of the body: `max_tokens`
    (every adapter reads it: the OpenAI-compatible ones send it as both names, Ollama's as `num_predict`),
    and `max_completion_tokens` too where the client sent it (it wins over `max_tokens` on the engines)."""
    body["max_tokens"] = cap
    if endpoint == "chat" and "max_completion_tokens" in body:
        body["max_completion_tokens"] = cap


#: the most UTF-8 bytes of non-blank text a token averages under any tokenizer in use (the rule of
#: adapters/ollama_prompt.min_tokens, which the Ollama adapter checks answers with)
FLOOR_BYTES_PER_TOKEN = 8

#: the blanks a floor leaves out; each one byte in UTF-8, and no byte of a multi-byte character is one
_BLANKS = b" \n\t\r"


def _bounds(text: str) -> tuple[int, int]:
    """(`min_tokens(text)`, its UTF-8 bytes: at most one token each)."""
    # its UTF-8 bytes once (a copy for ASCII), and the non-blank ones in one pass: four str.count()s were four
    # passes, the largest cost of reading an agent's 74 KB request (issue 36)
    data = text.encode("utf-8", "surrogatepass")
    return len(data.translate(None, _BLANKS)) // FLOOR_BYTES_PER_TOKEN, len(data)


def min_tokens(text: str) -> int:
    """A lower bound of the tokens of `text`: its non-blank UTF-8 bytes over FLOOR_BYTES_PER_TOKEN."""
    return _bounds(text)[0]


def _largest_floor(value: Any) -> int:
    """The floor of the largest prompt of a completions prompt or embeddings input (a string, a list of
    strings, token ids, or lists of token ids: each id is one token)."""
    if isinstance(value, str):
        return min_tokens(value)
    if isinstance(value, list) and value:
        if all(isinstance(v, int) for v in value):
            return len(value)
        return max((min_tokens(v) if isinstance(v, str) else len(v) if isinstance(v, list) else 0) for v in value)
    return 0


def _text_size(value: Any, name: str) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for v in value:
            if isinstance(v, str):
                total += len(v)
            elif isinstance(v, int):
                total += 4
            elif isinstance(v, list):
                total += 4 * len(v)
        return total
    raise InvalidRequest(f"'{name}' must be a string or an array", param=name)


def _prefix_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value[0]
    return ""


def affinity_key(text: str, chars: int) -> str | None:
    if not text:
        return None
    return hashlib.blake2b(text[:chars].encode("utf-8", "replace"), digest_size=8).hexdigest()
