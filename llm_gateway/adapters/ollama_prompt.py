"""What the Ollama adapter asked of Ollama for one call, kept to read its answer with: a lower bound of
the prompt's tokens under any tokenizer (`min_tokens`), the context window the request set, whether
truncation was turned off, whether logprobs were asked for. An Ollama before 0.12.6 ignores
`truncate: false` and cuts a long prompt silently; an answer whose `prompt_eval_count` is below the
floor shows it (adapters/ollama.py, adapters/ollama_stream.py). And the words each Ollama version
uses to refuse a prompt longer than the context window (`is_context_error`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from llm_gateway.types import Endpoint

#: no tokenizer in use averages more bytes a token than this over a prompt's non-blank text (prose runs
#: 3 to 5, CJK 2 to 4, code and base64 less); vocabularies hold long runs of blanks as one token
MAX_BYTES_PER_TOKEN = 8
_BLANKS = (b" ", b"\n", b"\t", b"\r")


def min_tokens(text: str) -> int:
    """A lower bound of the tokens of `text` under any tokenizer in use: its UTF-8 bytes that are not
    blanks, at `MAX_BYTES_PER_TOKEN` (C-speed: a few milliseconds for the largest body)."""
    raw = text.encode("utf-8", "surrogatepass")
    return (len(raw) - sum(raw.count(b) for b in _BLANKS)) // MAX_BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class PromptFacts:
    """What the adapter asked of Ollama for one call, read back with its answer."""

    #: a lower bound of the prompt's tokens (`min_tokens` of its text; images and templates not counted)
    floor: int = 0
    #: the context window the request set itself (`num_ctx`), else None (the model's own, not known here)
    num_ctx: int | None = None
    #: False when the client asked Ollama to truncate (`truncate: true`): a cut prompt is then no surprise
    check_truncation: bool = False
    logprobs: bool = False


def prompt_facts(endpoint: Endpoint, body: dict[str, Any], native: dict[str, Any]) -> PromptFacts:
    """The facts of one built request: `body` the client's, `native` what goes to Ollama."""
    if endpoint == "chat":
        texts = [_content_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict)]
    elif endpoint == "completions":
        texts = [native.get("prompt") or ""]
    else:
        return PromptFacts()  # /api/embed honours truncate: false in every version (an error up front)
    opts = native.get("options")
    num_ctx = opts.get("num_ctx") if isinstance(opts, dict) else None
    return PromptFacts(
        floor=sum(min_tokens(t) for t in texts),
        num_ctx=num_ctx if isinstance(num_ctx, int) and not isinstance(num_ctx, bool) and num_ctx > 0 else None,
        check_truncation=native.get("truncate") is False,
        logprobs=native.get("logprobs") is True,
    )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


#: Ollama's words for a prompt longer than the context window, across versions (adapters/ollama.py's docstring)
_CONTEXT_HINTS = (
    "exceeds the context length",
    "exceeds maximum context length",
    "exceeds the available context size",
    "exceed_context_size_error",
    "longer than the context length",
)


def context_message(message: str) -> str:
    """The words of an Ollama error, unwrapping the llama-server JSON error that HEAD puts in its own."""
    try:
        inner = orjson.loads(message)
    except orjson.JSONDecodeError:
        return message
    err = inner.get("error") if isinstance(inner, dict) else None
    text = err.get("message") if isinstance(err, dict) else None
    return text if isinstance(text, str) else message


def is_context_error(message: str) -> bool:
    """Does an Ollama error say the prompt is longer than the context window (any version's words)?"""
    low = message.lower()
    return any(h in low for h in _CONTEXT_HINTS)
