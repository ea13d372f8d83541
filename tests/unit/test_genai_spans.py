"""genai_spans.finish_reasons: what FINISH_REASON's pattern finds (finish_reason, stop_reason,
incomplete_details.reason, a Responses stream's response.completed / response.failed), found by a pattern that
begins only where a match can begin; compared with a plain reference (no regular expression) on real answers and
events and on 20,000 random strings made of the pieces a match is made of and the near misses around them."""

from __future__ import annotations

import random

import pytest

from llm_gateway.observability.genai_spans import FINISH_REASON, finish_reasons

WS = b" \t\n\r\x0b\x0c"  # what \s matches in a bytes pattern
LOWER = frozenset(b"abcdefghijklmnopqrstuvwxyz_")


def reference(data: bytes) -> list[bytes]:
    """Left to right: where a match begins, its reason, and the search goes on after it; else one byte on."""
    out: list[bytes] = []
    i = 0
    while i < len(data):
        found = _match_at(data, i)
        if found is None:
            i += 1
        else:
            out.append(found[0])
            i = found[1]
    return out


def _skip_ws(data: bytes, j: int) -> int:
    while j < len(data) and data[j] in WS:
        j += 1
    return j


def _then(data: bytes, j: int | None, *pieces: bytes) -> int | None:
    """After j: each piece, whitespace allowed before each but the first."""
    for n, piece in enumerate(pieces):
        if j is None:
            return None
        if n:
            j = _skip_ws(data, j)
        j = j + len(piece) if data.startswith(piece, j) else None
    return j


def _reason(data: bytes, j: int | None) -> tuple[bytes, int] | None:
    """Whitespace, then a quoted run of 1-32 of [a-z_]."""
    if j is None:
        return None
    j = _skip_ws(data, j)
    if not data.startswith(b'"', j):
        return None
    k = j + 1
    while k < len(data) and data[k] in LOWER:
        k += 1
    if 1 <= k - j - 1 <= 32 and data.startswith(b'"', k):
        return data[j + 1 : k], k + 1
    return None


def _match_at(data: bytes, i: int) -> tuple[bytes, int] | None:
    for key in (b'"finish_reason"', b'"stop_reason"'):
        if data.startswith(key, i):
            return _reason(data, _then(data, i, key, b":"))
    if data.startswith(b'"incomplete_details"', i):
        return _reason(data, _then(data, i, b'"incomplete_details"', b":", b"{", b'"reason"', b":"))
    j = _then(data, i, b'"type"', b":", b'"response.')
    for end in (b"completed", b"failed"):
        if j is not None and data.startswith(end + b'"', j):
            return end, j + len(end) + 1
    return None


REAL = [
    b'{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},'
    b'"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}',
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n',
    b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{}}\n\n',
    b'{"id":"r","status":"incomplete","incomplete_details": { "reason" : "max_output_tokens" },"output":[]}',
    b'event: response.completed\ndata: {"type":"response.completed","response":{"incomplete_details":null}}\n\n',
    b'event: response.failed\ndata: {"type" : "response.failed","response":{"status":"failed"}}\n\n',
    b'data: {"type":"response.output_text.delta","delta":"the reason: \\"stop\\""}\n\n',
    b'{"choices":[{"finish_reason":"stop"},{"finish_reason":"tool_calls"}],"x_reason":"no","reason":"no"}',
]
PIECES = [
    b'"finish_reason"',
    b'"stop_reason"',
    b'"x_reason"',
    b'"incomplete_details"',
    b'"reason"',
    b'"type"',
    b'"response.completed"',
    b'"response.failed"',
    b'"response.',
    b"completed",
    b'failed"',
    b"finish_",
    b"reason",
    b'"re',
    b'ason"',
    b"sponse.",
    b'"stop"',
    b'"length"',
    b'"end_turn"',
    b'"' + b"a" * 32 + b'"',
    b'"' + b"a" * 33 + b'"',
    b'"Stop"',
    b'""',
    b"null",
    b":",
    b": ",
    b" ",
    b"\n",
    b"\t",
    b"{",
    b"}",
    b",",
    b'"',
    b"_",
    b"x",
]


@pytest.mark.parametrize("data", REAL)
def test_real_answers_and_events_give_what_the_whole_pattern_and_the_reference_give(data: bytes) -> None:
    whole = [a or b or c for a, b, c in FINISH_REASON.findall(data)]
    assert finish_reasons(data) == whole == reference(data)


def test_the_reasons_of_real_answers_and_events() -> None:
    assert [finish_reasons(d) for d in REAL] == [
        [b"length"],
        [],
        [b"stop"],
        [b"end_turn"],
        [b"max_output_tokens"],
        [b"completed"],
        [b"failed"],
        [],
        [b"stop", b"tool_calls"],
    ]


KEYS = [b'"finish_reason"', b'"stop_reason"', b'"incomplete_details"', b'"type"', b'"reason"', b'"x_reason"', b"reason"]
SEPS = [b":", b" : ", b":\n\t", b"", b"=", b": {", b":{ ", b"{"]
VALUES = [
    b'"stop"',
    b'"response.completed"',
    b'"response.failed"',
    b'"response.done"',
    b"null",
    b'"' + b"a" * 33 + b'"',
]


def random_string(rng: random.Random) -> bytes:
    """Pieces, and key-separator-value runs (a match, or one piece off one)."""
    out = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.5:
            out.append(rng.choice(PIECES))
        else:
            out += (rng.choice(KEYS), rng.choice(SEPS), rng.choice(VALUES + KEYS + PIECES[:3]))
    return b"".join(out)


def test_20000_random_strings_give_what_the_reference_gives() -> None:
    rng = random.Random(40)
    found = mixed = 0
    reasons: set[bytes] = set()
    for _ in range(20_000):
        data = random_string(rng)
        want = reference(data)
        assert finish_reasons(data) == want, data
        found += bool(want)
        mixed += len(set(want)) > 1
        reasons.update(want)
    # matches often enough for the comparison to mean something, of every kind, and several in one string
    assert found > 2_500 and mixed > 150
    assert {b"stop", b"completed", b"failed", b"reason"} <= reasons
