"""otlp.Encoder's caches change no byte: random spans (every attribute type, recurring and unique values, a key's
value changing type, long and non-ASCII strings, None) encode to exactly what a plain encoder with no cache writes,
the second time too, and parse back with the official protobufs (opentelemetry-proto); a key's kept values are
bounded; a unique key's values (genai_spans.UNIQUE_KEYS: a request id) are never kept."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from llm_gateway.observability import otlp
from llm_gateway.observability.genai_spans import CLIENT_KEYS, SERVER_KEYS, UNIQUE_KEYS

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 127, n >> 7
        out.append(byte | (128 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, data: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(data)) + data


def any_value(v: Any) -> bytes:
    if isinstance(v, bool):
        return varint(2 << 3) + varint(int(v))
    if isinstance(v, int):
        return varint(3 << 3) + varint(v & (2**64 - 1))
    if isinstance(v, float):
        return varint(4 << 3 | 1) + struct.pack("<d", v)
    if isinstance(v, list | tuple):
        return field(5, b"".join(field(1, any_value(x)) for x in v))
    return field(1, str(v).encode())


def key_value(number: int, k: str, v: Any) -> bytes:
    return field(number, field(1, k.encode()) + field(2, any_value(v)))


def plain_span(s: otlp.Span) -> bytes:
    """Span, field by field, in trace.proto's order, nothing kept."""
    name, trace_id, span_id, parent, kind, start, end, keys, values, attrs, events, error, state = s
    out = field(1, trace_id.to_bytes(16, "big")) + field(2, span_id.to_bytes(8, "big"))
    if state:
        out += field(3, state.encode())
    if parent:
        out += field(4, parent.to_bytes(8, "big"))
    out += field(5, name.encode()) + varint(6 << 3) + varint(kind)
    out += varint(7 << 3 | 1) + struct.pack("<Q", start) + varint(8 << 3 | 1) + struct.pack("<Q", end)
    fixed = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
    for k, v in fixed + [(k, v) for k, v in attrs.items() if v is not None]:
        out += key_value(9, k, v)
    for ev_name, at in events:
        out += field(11, varint(1 << 3 | 1) + struct.pack("<Q", at) + field(2, ev_name.encode()))
    if error is not None:
        out += field(15, field(2, error.encode()) + varint(3 << 3) + varint(2))
    return out


def plain_request(resource: dict[str, Any], scope: str, spans: list[otlp.Span]) -> bytes:
    res = field(1, b"".join(key_value(1, k, v) for k, v in resource.items()))
    scope_spans = field(2, field(1, field(1, scope.encode())) + b"".join(field(2, plain_span(s)) for s in spans))
    return field(1, res + scope_spans)


def random_value(rng: random.Random) -> Any:
    pick = rng.randrange(12)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, -1, 2, 300, 2**62, -(2**40), rng.randrange(10**6)])
    if pick == 3:
        return rng.choice([0.0, 1.0, 0.5, -2.25, rng.random()])
    if pick == 4:
        return rng.choice([["stop"], ("stop", "length"), [1, 2], (True,), ("a", 1), ()])
    if pick == 5:
        return "é" * rng.choice([1, 40, 70, 150])  # two bytes a character: lengths in bytes, not characters
    if pick == 6:
        return "x" * rng.choice([0, 100, 117, 118, 119, 200, 201, 300])  # one- and two-byte lengths either side
    return rng.choice(["chat", "fake-model", "vllm", "default", "ok", "POST", f"v{rng.randrange(3000)}"])


def fixed_value(rng: random.Random, key: str) -> Any:
    """A fixed attribute's value: a scalar or None, one type a key (as tracing.py's are: the block of fixed
    attributes is kept by its values, where True == 1 == 1.0)."""
    if rng.random() < 0.2:
        return None
    kind = sum(map(ord, key)) % 4
    if kind == 0:
        return rng.random() < 0.5
    if kind == 1:
        return rng.choice([0, 1, 200, 499, -3, 2**40])
    if kind == 2:
        return rng.choice([0.5, 1.0, 0.0])
    return rng.choice(["chat", "fake-model", "é" * 70, "x" * 300, ""])


def random_span(rng: random.Random) -> otlp.Span:
    keys = rng.choice([SERVER_KEYS, CLIENT_KEYS, ("k",), ()])
    values = tuple(fixed_value(rng, k) for k in keys)
    attrs: dict[str, Any] = {}
    for _ in range(rng.randrange(8)):
        attrs[rng.choice(["a", "b", "gen_ai.usage.input_tokens", "k" * 130])] = random_value(rng)
    for unique in UNIQUE_KEYS:
        if rng.random() < 0.5:
            attrs[unique] = rng.choice(
                [f"{rng.getrandbits(64):016x}", "é" * rng.randrange(1, 80), "y" * rng.randrange(90, 300), None]
            )
    events = tuple((rng.choice(["gen_ai.first_token", "e"]), rng.getrandbits(63)) for _ in range(rng.randrange(3)))
    return (
        rng.choice(["chat fake-model", "gateway.queue", "POST /v1/x", "n" * 130]),
        rng.getrandbits(128) or 1,
        rng.getrandbits(64) or 1,
        rng.choice([0, rng.getrandbits(64) or 1]),
        rng.choice([otlp.INTERNAL, otlp.SERVER, otlp.CLIENT]),
        rng.getrandbits(63),
        rng.getrandbits(63),
        keys,
        values,
        attrs,
        events,
        rng.choice([None, "upstream_unreachable", ""]),
        rng.choice(["", "vendor=abc", "z" * 200]),
    )


def test_random_spans_encode_to_the_plain_encoders_bytes_first_and_from_the_caches() -> None:
    rng = random.Random(40)
    resource = {"service.name": "gw", "n": 1}
    enc = otlp.Encoder(resource, "llm_gateway", UNIQUE_KEYS)
    batches = [[random_span(rng) for _ in range(50)] for _ in range(40)]
    for _ in range(2):  # the second time, what recurs comes from the caches
        for batch in batches:
            assert enc.request(batch) == plain_request(resource, "llm_gateway", batch)


def test_what_the_encoder_writes_the_official_protobufs_read_back() -> None:
    rng = random.Random(41)
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    batch = [random_span(rng) for _ in range(200)]
    for _ in range(2):
        req = pb.ExportTraceServiceRequest.FromString(enc.request(batch))
        spans = req.resource_spans[0].scope_spans[0].spans
        assert len(spans) == len(batch)
        for got, s in zip(spans, batch, strict=True):
            keys, values, attrs = s[7], s[8], s[9]
            want = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
            want.update({k: v for k, v in attrs.items() if v is not None})
            assert [a.key for a in got.attributes] == list(want)
            for a in got.attributes:
                if isinstance(want[a.key], str):
                    assert a.value.string_value == want[a.key]


def test_a_keys_kept_values_are_bounded_and_a_unique_keys_are_never_kept() -> None:
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    for i in range(5_000):
        attrs = {"gateway.request_id": f"{i:016x}", "model": f"m{i}", "n": i + 2, "gen_ai.output.messages": "t"}
        span = ("s", 1, 2, 0, otlp.SERVER, 1, 2, (), (), attrs, (), None, "")
        assert enc.request([span]) == plain_request({}, "x", [span])
    kept = {k: v for k, v in enc._kv.items() if v}  # a key's cache is made at its first lookup, empty till a value
    assert not set(UNIQUE_KEYS) & set(kept)
    assert 0 < len(kept["model"]) <= 1024 and 0 < len(kept["n"]) <= 1024


def test_a_none_attribute_is_no_attribute_and_nothing_is_kept_for_it() -> None:
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    span = ("s", 1, 2, 0, otlp.SERVER, 1, 2, (), (), {"a": None, "gateway.request_id": None, "b": "v"}, (), None, "")
    assert enc.request([span]) == plain_request({}, "x", [span])
    assert {k for k, kept in enc._kv.items() if kept} == {"b"}


def test_tracings_encoder_never_keeps_the_unique_keys_values() -> None:
    from llm_gateway.observability.tracing import Tracing
    from llm_gateway.settings import TracingConfig

    tr = Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9"))
    try:
        assert tr.batcher.encoder._unique == frozenset(UNIQUE_KEYS) >= {"gateway.request_id"}
    finally:
        tr.shutdown()


def test_attempt_spans_kept_by_their_values_identity_still_write_their_own_name_keys_and_values() -> None:
    """An attempt's span (no other attributes, events or error) has its name and fixed attributes' bytes kept by the
    identity of its values tuple (Tracing.clients hands out the same one): the same tuple under another name or
    other keys, and an equal tuple that is another object, each write their own bytes; what is kept is bounded."""
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    values = ("chat", "vllm", "m", "h", 80, "d", "vllm", "r", "least_load", 1, "default")
    other = (*values[:-1], "batch")
    keys = tuple(f"k{i}" for i in range(len(CLIENT_KEYS)))
    spans = [
        (name, 1, 2, 3, otlp.CLIENT, 4, 5, ks, vs, {}, (), None, state)
        for name in ("chat m", "chat n")
        for ks, vs in ((CLIENT_KEYS, values), (CLIENT_KEYS, other), (keys, values), (CLIENT_KEYS, tuple(values)))
        for state in ("", "v=1")
    ]
    for _ in range(3):
        for s in spans:
            assert enc.request([s]) == plain_request({}, "x", [s])
    for i in range(3000):
        s = ("chat m", 1, 2, 3, otlp.CLIENT, 4, 5, CLIENT_KEYS, (*values[:-1], f"c{i}"), {}, (), None, "")
        assert enc.request([s]) == plain_request({}, "x", [s])
    assert len(enc._by_id) <= 1024
