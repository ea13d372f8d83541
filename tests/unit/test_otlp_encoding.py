"""otlp.Encoder's caches change no byte: random spans (every attribute type, recurring and unique values, a key's
value changing type, long and non-ASCII strings, None; fixed, own (by position) and other attributes) encode to
exactly what a plain encoder with no cache writes, the second time too, and parse back with the official protobufs
(opentelemetry-proto); a key's kept values are bounded; a unique key's values (genai_spans.UNIQUE_KEYS: a request
id) are never kept."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from llm_gateway.observability import otlp
from llm_gateway.observability.genai_spans import (
    CLIENT_KEYS,
    FAILURE_KEYS,
    QUEUE_OWN_KEYS,
    SERVER_KEYS,
    SERVER_OWN_KEYS,
    UNIQUE_KEYS,
)

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
    name, kind, trace_id, span_id, parent, state, start, end, keys, values, own, own_values, attrs, events, error = s
    out = field(1, trace_id) + field(2, span_id)
    if state:
        out += field(3, state.encode())
    if parent:
        out += field(4, parent)
    out += field(5, name.encode()) + varint(6 << 3) + varint(kind)
    out += varint(7 << 3 | 1) + struct.pack("<Q", start) + varint(8 << 3 | 1) + struct.pack("<Q", end)
    for k, v in [*zip(keys, values, strict=True), *zip(own, own_values, strict=True), *attrs.items()]:
        if v is not None:
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


def unique_value(rng: random.Random) -> Any:
    return rng.choice([f"{rng.getrandbits(64):016x}", "é" * rng.randrange(1, 80), "y" * rng.randrange(90, 300), None])


#: own keys tuples: tracing.py's, one with unique keys among others, and one with a key of over 127 bytes
OWN_KEYS = [
    SERVER_OWN_KEYS,
    FAILURE_KEYS,
    QUEUE_OWN_KEYS,
    ("a", "gateway.request_id", "gen_ai.usage.input_tokens", "gen_ai.output.messages", "b"),
    ("k" * 130,),
    (),
]


def own_value(rng: random.Random, key: str) -> Any:
    """An own attribute's value: one type a key (as tracing.py's are: each key's values are kept by value, where
    True == 1 == 1.0), a unique key's a string; absent (None) often."""
    if key in UNIQUE_KEYS:
        return unique_value(rng)
    if rng.random() < 0.3:
        return None
    kind = sum(map(ord, key)) % 6
    if kind == 0:
        return rng.random() < 0.5
    if kind == 1:
        return rng.choice([0, 1, 2, 127, 128, 300, -1, -(2**40), 2**62, rng.randrange(10**6)])
    if kind == 2:
        return rng.choice([0.0, 1.0, 0.5, -2.25, rng.random()])
    if kind == 3:
        return rng.choice([("stop",), ("stop", "length"), (), ("é" * 70,)])
    if kind == 4:
        return "x" * rng.choice([0, 100, 117, 118, 119, 200, 201, 300])  # one- and two-byte lengths either side
    return rng.choice(["chat", "é" * 40, f"v{rng.randrange(3000)}"])


def random_span(rng: random.Random) -> otlp.Span:
    keys = rng.choice([SERVER_KEYS, CLIENT_KEYS, ("k",), ()])
    values = tuple(fixed_value(rng, k) for k in keys)
    own = rng.choice(OWN_KEYS)
    own_values = tuple(own_value(rng, k) for k in own)
    attrs: dict[str, Any] = {}
    for _ in range(rng.randrange(8) if rng.random() < 0.5 else 0):
        attrs[rng.choice(["a", "b", "gen_ai.usage.input_tokens", "k" * 130])] = random_value(rng)
    for unique in UNIQUE_KEYS:
        if rng.random() < 0.2:
            attrs[unique] = unique_value(rng)
    events = tuple((rng.choice(["gen_ai.first_token", "e"]), rng.getrandbits(63)) for _ in range(rng.randrange(3)))
    return (
        rng.choice(["chat fake-model", "gateway.queue", "POST /v1/x", "n" * 130]),
        rng.choice([otlp.INTERNAL, otlp.SERVER, otlp.CLIENT]),
        rng.randbytes(16),
        rng.randbytes(8),
        rng.choice([b"", rng.randbytes(8)]),
        rng.choice(["", "vendor=abc", "z" * 200]),
        rng.getrandbits(63),
        rng.getrandbits(63),
        keys,
        values,
        own,
        own_values,
        attrs if attrs else otlp.NO_ATTRS,
        events if rng.random() < 0.7 else (),
        rng.choice([None, None, "upstream_unreachable", ""]),
    )


def test_random_spans_encode_to_the_plain_encoders_bytes_first_and_from_the_caches() -> None:
    rng = random.Random(40)
    resource = {"service.name": "gw", "n": 1}
    enc = otlp.Encoder(resource, "llm_gateway", UNIQUE_KEYS)
    batches = [[random_span(rng) for _ in range(50)] for _ in range(40)]
    for _ in range(2):  # the second time, what recurs comes from the caches
        for batch in batches:
            assert enc.request(list(map(enc.span, batch))) == plain_request(resource, "llm_gateway", batch)


def test_what_the_encoder_writes_the_official_protobufs_read_back() -> None:
    rng = random.Random(41)
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    batch = [random_span(rng) for _ in range(200)]
    for _ in range(2):
        req = pb.ExportTraceServiceRequest.FromString(enc.request(list(map(enc.span, batch))))
        spans = req.resource_spans[0].scope_spans[0].spans
        assert len(spans) == len(batch)
        for got, s in zip(spans, batch, strict=True):
            keys, values, own, own_values, attrs = s[8], s[9], s[10], s[11], s[12]
            want = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
            want += [(k, v) for k, v in zip(own, own_values, strict=True) if v is not None]
            want += [(k, v) for k, v in attrs.items() if v is not None]
            assert [a.key for a in got.attributes] == [k for k, _ in want]
            for a, (_, v) in zip(got.attributes, want, strict=True):
                assert value(a.value) == (list(v) if isinstance(v, list | tuple) else v)
            assert (got.trace_id, got.span_id, got.parent_span_id, got.trace_state) == (s[2], s[3], s[4], s[5])
            assert (got.name, got.kind, got.start_time_unix_nano, got.end_time_unix_nano) == (s[0], s[1], s[6], s[7])


def value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind)


TID, SID = bytes(range(1, 17)), bytes(range(1, 9))


def span_of(attrs: dict[str, Any], own: tuple[str, ...] = (), own_values: tuple[Any, ...] = ()) -> otlp.Span:
    return ("s", otlp.SERVER, TID, SID, b"", "", 1, 2, (), (), own, own_values, attrs, (), None)


@pytest.mark.parametrize("by_position", [False, True])
def test_a_keys_kept_values_are_bounded_and_a_unique_keys_are_never_kept(by_position: bool) -> None:
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    own = ("gateway.request_id", "model", "n", "gen_ai.output.messages")
    for i in range(5_000):
        values = (f"{i:016x}", f"m{i}", i + 2, "t" * (i % 300))
        span = span_of({}, own, values) if by_position else span_of(dict(zip(own, values, strict=True)))
        assert enc.request([enc.span(span)]) == plain_request({}, "x", [span])
    if by_position:  # each key's Kept (its None: b"")
        kept = {k: len(v) - 1 for k, v in enc._kept.items()}
    else:  # by key and type
        kept = {k: len(v) for (k, _), v in enc._typed.items()}
    assert {k: n for k, n in kept.items() if n} == {"model": kept["model"], "n": kept["n"]}
    assert 0 < kept["model"] <= 1024 and 0 < kept["n"] <= 1024
    if not by_position:
        assert 0 < len(enc._unique_heads["gen_ai.output.messages"]) <= 300  # a unique key's heads: by length


def test_a_none_attribute_is_no_attribute_and_nothing_is_kept_for_it() -> None:
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    span = span_of({"a": None, "gateway.request_id": None, "b": "v"})
    assert enc.request([enc.span(span)]) == plain_request({}, "x", [span])
    assert {k for (k, _), kept in enc._typed.items() if kept} == {"b"}
    span = span_of({}, ("c", "gateway.request_id", "d", "e"), (None, None, "w", None))
    assert enc.request([enc.span(span)]) == plain_request({}, "x", [span])
    assert {k for k, kept in enc._kept.items() if set(kept) - {None}} == {"d"}


def read_back(data: bytes) -> Any:
    return pb.ExportTraceServiceRequest.FromString(data).resource_spans[0].scope_spans[0].spans


def test_the_request_spans_own_attributes_by_position_the_official_protobufs_read_back() -> None:
    """tracing.py's request span: its own attributes by position (SERVER_OWN_KEYS), each absent (None) in turn, all
    absent, and all there (a float, a unique string, a tuple, a bool); a failed attempt's (FAILURE_KEYS)."""
    enc = otlp.Encoder({}, "x", UNIQUE_KEYS)
    full = (42, 64, ("stop", "length"), "0123456789abcdef01234567", 0.25, 0.0125, True)
    cases = [full, (None,) * len(full), *((*full[:i], None, *full[i + 1 :]) for i in range(len(full)))]
    for _ in range(2):  # the second time from the caches
        for own_values in cases:
            span = span_of({"gen_ai.output.messages": "ok"}, SERVER_OWN_KEYS, own_values)
            assert enc.request([enc.span(span)]) == plain_request({}, "x", [span])
            (got,) = read_back(enc.request([enc.span(span)]))
            want = {k: v for k, v in zip(SERVER_OWN_KEYS, own_values, strict=True) if v is not None}
            want["gen_ai.output.messages"] = "ok"
            assert {a.key: value(a.value) for a in got.attributes} == {
                k: list(v) if isinstance(v, tuple) else v for k, v in want.items()
            }
        failed = span_of({}, FAILURE_KEYS, ("upstream_unreachable", 502, True))
        (got,) = read_back(enc.request([enc.span(failed)]))
        assert {a.key: value(a.value) for a in got.attributes} == dict(zip(FAILURE_KEYS, failed[11], strict=True))


def test_tracings_encoder_never_keeps_the_unique_keys_values() -> None:
    from llm_gateway.observability.tracing import Tracing
    from llm_gateway.settings import TracingConfig

    tr = Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9"))
    try:
        assert tr.encoder._unique == frozenset(UNIQUE_KEYS) >= {"gateway.request_id"}
        assert tr.batcher.encoder is tr.encoder
    finally:
        tr.shutdown()
