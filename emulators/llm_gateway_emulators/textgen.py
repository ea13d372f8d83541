"""Deterministic "model": tokens, stop strings, prompt counts, embeddings, ids, clocks.

Generation cycles a fixed vocabulary in order, one token per step, so a test can pick a
stop string that is bound to occur (``" test"`` is the 6th token). Stop strings are
matched across token boundaries; text that might be the start of a stop string is held
back until it is known not to be, as llama.cpp and vLLM do. Also owns the prompt-token
estimate, the 64-dimension embeddings, response ids and the timestamp formats engines use.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import string
import struct
import time
from datetime import UTC, datetime
from typing import Any

VOCAB: tuple[str, ...] = (
    "Hello",
    ",",
    " this",
    " is",
    " a",
    " test",
    " of",
    " the",
    " emulated",
    " engine",
    ".",
    " It",
    " streams",
    " one",
    " token",
    " per",
    " chunk",
    " and",
    " stops",
    " on",
    " demand",
    "!",
)
#: Token ids reported where an engine returns them (vocab index + 100).
TOKEN_ID_BASE = 100
EMBED_DIM = 64


def token_text(i: int) -> str:
    return VOCAB[i % len(VOCAB)]


def token_id(i: int) -> int:
    return TOKEN_ID_BASE + i % len(VOCAB)


def expected_text(n: int) -> str:
    """The text of the first ``n`` tokens (what a request with max_tokens=n returns)."""
    return "".join(token_text(i) for i in range(n))


class Generation:
    """Steps through tokens; ``step()`` returns (visible delta, finish_reason or None)."""

    __slots__ = ("_keep", "_pending", "_tail", "count", "finish_at_limit", "limit", "matched", "stops")

    def __init__(self, limit: int, finish_at_limit: str, stops: list[str]) -> None:
        self.limit = limit
        self.finish_at_limit = finish_at_limit
        self.stops = [s for s in stops if s]
        self.count = 0
        self.matched: str | None = None
        self._pending = ""
        self._tail = ""
        self._keep = max((len(s) for s in self.stops), default=1) - 1

    def step(self) -> tuple[str, str | None]:
        tok = VOCAB[self.count % len(VOCAB)]
        self.count += 1
        at_limit = self.count >= self.limit
        if not self.stops:
            return tok, (self.finish_at_limit if at_limit else None)
        combined = self._pending + tok
        window = self._tail + combined
        base = len(self._tail)
        best, matched = -1, None
        for s in self.stops:
            i = window.find(s)
            if i >= 0 and (best < 0 or i < best):
                best, matched = i, s
        if best >= 0:
            self.matched = matched
            self._pending = ""
            return (window[base:best] if best > base else ""), "stop"
        hold = _partial_stop_len(window, self.stops, len(combined))
        out = combined[: len(combined) - hold]
        self._pending = combined[len(combined) - hold :]
        if self._keep:
            self._tail = (self._tail + out)[-self._keep :]
        if at_limit:
            out, self._pending = out + self._pending, ""
            return out, self.finish_at_limit
        return out, None


def _partial_stop_len(window: str, stops: list[str], max_len: int) -> int:
    """Length of the longest suffix of ``window`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(window), max_len), best, -1):
            if window.endswith(s[:k]):
                best = k
                break
    return best


def run_all(limit: int, finish_at_limit: str, stops: list[str]) -> tuple[str, str, int, str | None]:
    """Generate to the end: (text, finish_reason, completion_tokens, matched_stop)."""
    if limit <= 0:
        return "", "length", 0, None
    gen = Generation(limit, finish_at_limit, stops)
    parts: list[str] = []
    while True:
        delta, finish = gen.step()
        parts.append(delta)
        if finish is not None:
            return "".join(parts), finish, gen.count, gen.matched


# ---- prompts -----------------------------------------------------------------------
def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, str):
                out.append(part)
        return " ".join(out)
    return ""


def text_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def chat_prompt_tokens(messages: list[Any]) -> int:
    """A chat-template-like estimate: 3 + per message (4 + ceil(len/4))."""
    n = 3
    for m in messages:
        if isinstance(m, dict):
            n += 4 + (len(content_text(m.get("content"))) + 3) // 4
    return n


def prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, int) for p in prompt):
            return len(prompt)
        return sum(prompt_tokens(p) for p in prompt) or 1
    return text_tokens(prompt if isinstance(prompt, str) else "") + 1


def stop_list(stop: Any) -> list[str]:
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str)]
    return []


# ---- embeddings --------------------------------------------------------------------
def embedding(text: str, dim: int = EMBED_DIM) -> list[float]:
    """A unit vector derived from the text's SHA-256 (same text, same vector)."""
    raw = b""
    counter = 0
    while len(raw) < dim * 4:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    ints = struct.unpack(f"<{dim}I", raw[: dim * 4])
    vec = [(v / 0xFFFFFFFF) * 2.0 - 1.0 for v in ints]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    # round-trip through float32 so float and base64 encodings agree exactly
    packed = struct.pack(f"<{dim}f", *(v / norm for v in vec))
    return list(struct.unpack(f"<{dim}f", packed))


def embedding_b64(vec: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()


def embed_inputs(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return [" ".join(map(str, value))]
        return [v if isinstance(v, str) else str(v) for v in value]
    return []


# ---- ids and clocks ----------------------------------------------------------------
_ALNUM = string.ascii_letters + string.digits
# the emulators' own generator: they run as threads inside test processes, and touching the global
# `random` state there disturbs whatever else draws from it (Hypothesis warns about exactly that)
RNG = random.Random()


def rand_alnum(n: int) -> str:
    return "".join(RNG.choices(_ALNUM, k=n))


def rand_hex(n: int) -> str:
    return f"{RNG.getrandbits(4 * n):0{n}x}"


def go_time(ns: int | None = None) -> str:
    """Go's time.RFC3339Nano in UTC (trailing zeros of the fraction trimmed)."""
    ns = time.time_ns() if ns is None else ns
    secs, frac = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(secs, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{frac:09d}".rstrip("0")
    return f"{stamp}.{digits}Z" if digits else f"{stamp}Z"


def http_date(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, tz=UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")
