"""OTLP trace export without the OpenTelemetry SDK: finished spans as their protobuf bytes in a bounded queue,
framed into an `ExportTraceServiceRequest` by the export thread and sent in batches by one of otlp_senders.py's
senders (OTLP/HTTP or OTLP/gRPC).

Why not the SDK: its span objects and its OTLP encoding (message objects per attribute) cost ~54 µs per span on
this VM, 1.56x-2.02x the CPU of an untraced request at 100 % sampling (issue 40). Here a span is written where it
ends, from pieces kept as bytes: a span's name and attributes mostly recur (model, deployment, engine, route), so
each is encoded once and kept (`Encoder`'s caches: at most 1,024 values a key), but for the keys whose values are
each span's own (a request id: `Encoder`'s `unique`), written as they come; the ids are bytes already (tracing.py
makes them so). tracing.py writes its request and attempt spans by joining those pieces (the field tags below,
`TIMES`, and what `Encoder` keeps); `Encoder.span` writes any other span from a `Span` tuple. Written where it
ends, a span costs no tuple built on the loop and taken apart again in the export thread (that was ~40 % of what
tracing cost a request), and the queue holds bytes, which the garbage collector never visits.

The wire format is opentelemetry-proto's trace.proto / common.proto / resource.proto (v1, field numbers as
there; github.com/open-telemetry/opentelemetry-proto, opentelemetry/proto/trace/v1/trace.proto); a test parses
what this writes with the official generated classes. Batching follows the SDK's BatchSpanProcessor and its
OTEL_BSP_* variables: a queue of at most OTEL_BSP_MAX_QUEUE_SIZE spans (2048; a span that finds it full is dropped
and counted, the loop never waits), exported every OTEL_BSP_SCHEDULE_DELAY ms (5000) or as soon as
OTEL_BSP_MAX_EXPORT_BATCH_SIZE (512) are queued, each export bounded by OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT
(seconds, as the Python SDK reads it; 10), which the sender applies.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

#: a span to write (Encoder.span), by position: name, kind (OTLP's: 1 internal, 2 server, 3 client), trace id (16
#: bytes), span id (8 bytes), parent span id (8 bytes; b"": a root), tracestate (the W3C header's value, "" when
#: none), start and end (unix ns); its fixed attributes (a constant tuple of keys and a tuple of their values,
#: scalars of one type a key, a None value left out: encoded once per distinct values and kept, by the values
#: tuple, where True == 1 == 1.0); its own attributes (a constant tuple of keys and a tuple of their values, read by
#: position: each value of one type a key as well, kept per key where it recurs, a None value left out); its other
#: attributes (a dict: any types, a None value left out); events ((name, unix ns), ...); error (None: no error
#: status). The ids are bytes as the wire has them (big-endian, as their hex).
Span = tuple[
    str,
    int,
    bytes,
    bytes,
    bytes,
    str,
    int,
    int,
    tuple[str, ...],
    tuple[Any, ...],
    tuple[str, ...],
    tuple[Any, ...],
    dict[str, Any],
    tuple[tuple[str, int], ...],
    str | None,
]
INTERNAL, SERVER, CLIENT = 1, 2, 3
NO_ATTRS: dict[str, Any] = {}  # a span's other attributes when it has none (shared: never written to)
#: a Span's fields as they begin: trace_id 1, span_id 2, parent_span_id 4 (tag and length: the id follows)
TRACE_ID, SPAN_ID, PARENT_ID = b"\x0a\x10", b"\x12\x08", b"\x22\x08"
#: start 7 (fixed64: its tag ends Encoder.head's bytes), end 8: `TIMES(start, END, end)`
TIMES = struct.Struct("<QBQ").pack
END = 0x41
Q = struct.Struct("<Q").pack  # a fixed64 (an event's time)
D = struct.Struct("<d").pack  # a double (after Encoder.float_head)
_VARINT1 = [bytes((i,)) for i in range(128)]
_CACHE_MAX = 1024  # encoded values kept per attribute key (model, deployment, ... recur; a request id does not)


def _varint(n: int) -> bytes:
    if n < 128:
        return _VARINT1[n]
    out = bytearray()
    while n > 127:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: tag, length, data."""
    n = len(data)
    return tag + (_VARINT1[n] if n < 128 else _varint(n)) + data


def _any(value: Any) -> bytes:
    """An AnyValue: string 1, bool 2, int 3 (int64), double 4, array 5 (ArrayValue.values 1)."""
    t = type(value)
    if t is str:
        return _len(b"\x0a", value.encode())
    if t is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if t is int:
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if t is float:
        return b"\x21" + D(value)
    if t is list or t is tuple:
        return _len(b"\x2a", b"".join(_len(b"\x0a", _any(v)) for v in value))
    return _len(b"\x0a", str(value).encode())


def key_value(tag: bytes, key: str, value: Any) -> bytes:
    """A KeyValue (key 1, value 2) as field `tag` of its message (a span's attributes are field 9)."""
    return _len(tag, _len(b"\x0a", key.encode()) + _len(b"\x12", _any(value)))


def state_field(state: str) -> bytes:
    """A span's trace_state (3): the W3C tracestate as it came (b"": none)."""
    return _len(b"\x1a", state.encode()) if state else b""


def status_field(error: str | None) -> bytes:
    """A span's status (15) when it failed: Status.message 2, code 3 (2: error); b"" for None."""
    return b"" if error is None else _len(b"\x7a", _len(b"\x12", error.encode()) + b"\x18\x02")


class Kept(dict[Any, bytes]):
    """One attribute key's encoded attributes (KeyValues, field 9) by value: `kept[value]`, a None value b"" (no
    attribute). A value not kept yet is encoded and kept (at most _CACHE_MAX a key) where it may recur: a string of
    up to 200 characters, a number, a bool, a tuple of them; a key's values are of one type (True == 1 == 1.0: a
    lookup could not tell them apart), as tracing.py's are. A unique key's (`Encoder`'s `unique`) are never kept."""

    __slots__ = ("key", "unique")

    def __init__(self, key: str, unique: bool) -> None:
        super().__init__({None: b""})
        self.key, self.unique = key, unique

    def __missing__(self, value: Any) -> bytes:
        kv = key_value(b"\x4a", self.key, value)
        t = type(value)
        if not self.unique and ((t is str and len(value) <= 200) or t is int or t is float or t is bool or t is tuple):
            if len(self) >= _CACHE_MAX:
                self.clear()
                self[None] = b""
            self[value] = kv
        return kv


class UniqueHeads(dict[int, bytes]):
    """A unique key's string attribute of n bytes, all but the string, by n: the KeyValue's tag and length, its key
    1, and value 2's tag and length (AnyValue.string_value 1's tag and length). At most _CACHE_MAX kept."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = _len(b"\x0a", key.encode())

    def __missing__(self, n: int) -> bytes:
        value_head = b"\x12" + _varint(n + 1 + len(_varint(n))) + b"\x0a" + _varint(n)
        head = b"\x4a" + _varint(len(self.key) + len(value_head) + n) + self.key + value_head
        if len(self) >= _CACHE_MAX:
            self.clear()
        self[n] = head
        return head


class _SpanTags(dict[int, bytes]):
    """A span's length -> ScopeSpans.spans' tag (2) and that length (at most _CACHE_MAX kept)."""

    def __missing__(self, n: int) -> bytes:
        if len(self) >= _CACHE_MAX:
            self.clear()
        tag = self[n] = b"\x12" + _varint(n)
        return tag


class Encoder:
    """Spans' protobuf bytes and the pieces they are joined from, kept; an ExportTraceServiceRequest of written spans:
    one ResourceSpans (the process's resource) with one ScopeSpans. Its caches are the loop's (spans are written
    where they end); `request` is the export thread's."""

    def __init__(self, resource: dict[str, Any], scope: str, unique: Iterable[str] = ()) -> None:
        """`unique`: the attribute keys whose values differ from span to span (a request id, captured content):
        their values are written as they come, never kept."""
        res = b"".join(key_value(b"\x0a", k, v) for k, v in resource.items())  # Resource.attributes 1
        self._resource = _len(b"\x0a", res)  # ResourceSpans.resource 1
        self._scope = _len(b"\x0a", _len(b"\x0a", scope.encode()))  # ScopeSpans.scope 1 (InstrumentationScope.name)
        self._unique = frozenset(unique)
        self._tags = _SpanTags()  # the export thread's
        self._kept: dict[str, Kept] = {}  # key -> its Kept
        self._unique_heads: dict[str, UniqueHeads] = {}
        self._floats: dict[str, bytes] = {}  # key -> float_head
        self._typed: dict[tuple[str, type], dict[Any, bytes]] = {}  # (key, a value's type) -> attributes
        #: id of a keys tuple (a module constant) -> the tuple (held: its id stays its own) and, by its values, their
        #: encoded attributes
        self._blocks: dict[int, tuple[tuple[str, ...], dict[tuple[Any, ...], bytes]]] = {}
        self._heads: defaultdict[int, dict[str, bytes]] = defaultdict(dict)  # kind -> a span's name -> head
        self._events: dict[str, tuple[bytes, bytes]] = {}  # an event's name -> its bytes before and after its time

    def request(self, spans: list[bytes]) -> bytes:
        """The ExportTraceServiceRequest of written spans (resource_spans 1 -> scope_spans 2 -> spans 2), joined once
        (a batch is ~300 KB: each field wrapped around it would copy it); each span after its tag (by its length),
        all in C."""
        lengths = list(map(len, spans))
        tags = list(map(self._tags.__getitem__, lengths))
        out: list[bytes] = [b"\x0a", b"", self._resource, b"\x12", b"", self._scope, *spans, *spans]
        out[6::2], out[7::2] = tags, spans
        scope_spans = len(self._scope) + sum(lengths) + sum(map(len, tags))  # ScopeSpans: its scope and the spans
        out[4] = _varint(scope_spans)
        out[1] = _varint(len(self._resource) + 1 + len(out[4]) + scope_spans)  # ResourceSpans
        return b"".join(out)

    def span(self, s: Span) -> bytes:
        """One Span message's fields (a ScopeSpans.spans of `request`), in trace.proto's order."""
        name, kind, trace, sid, parent, state, start, end, keys, values, own, own_values, attrs, events, error = s
        # trace_id 1, span_id 2, [trace_state 3], [parent_span_id 4], name 5, kind 6, start 7 and end 8 (fixed64)
        parts = [TRACE_ID, trace, SPAN_ID, sid, state_field(state)]
        if parent:
            parts += (PARENT_ID, parent)
        parts += (self.head(name, kind), TIMES(start, END, end), self.block(keys, values))
        for k, v in zip(own, own_values, strict=True):
            parts.append(self.kept(k)[tuple(v) if type(v) is list else v])
        if attrs:
            parts.append(self.attributes(attrs))
        for ev_name, at in events:
            before, after = self.event(ev_name)
            parts += (before, Q(at), after)
        parts.append(status_field(error))
        return b"".join(parts)

    def head(self, name: str, kind: int) -> bytes:
        """A span's name (5), kind (6) and start's tag (7), kept."""
        heads = self._heads[kind]
        head = heads.get(name)
        if head is None:
            if len(heads) >= _CACHE_MAX:
                heads.clear()
            head = heads[name] = _len(b"\x2a", name.encode()) + bytes((0x30, kind, 0x39))
        return head

    def block(self, keys: tuple[str, ...], values: tuple[Any, ...]) -> bytes:
        """The fixed attributes' KeyValues (9), kept by their values (a span's request facts recur)."""
        if not keys:
            return b""
        blocks = self._blocks.get(id(keys))
        if blocks is None or blocks[0] is not keys:
            blocks = self._blocks[id(keys)] = (keys, {})
        kept = blocks[1].get(values)
        if kept is None:
            kept = b"".join(key_value(b"\x4a", k, v) for k, v in zip(keys, values, strict=True) if v is not None)
            if len(blocks[1]) >= _CACHE_MAX:
                blocks[1].clear()
            blocks[1][values] = kept
        return kept

    def kept(self, key: str) -> Kept:
        """The key's encoded attributes by value (made at its first)."""
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = Kept(key, key in self._unique)
        return kept

    def unique_heads(self, key: str) -> UniqueHeads:
        """A unique key's string attributes' heads by the string's length in bytes (made at its first)."""
        heads = self._unique_heads.get(key)
        if heads is None:
            heads = self._unique_heads[key] = UniqueHeads(key)
        return heads

    def float_head(self, key: str) -> bytes:
        """A double attribute's bytes before its 8-byte value (D): the KeyValue's tag and length, its key 1 and value
        2 (AnyValue.double_value 4)."""
        head = self._floats.get(key)
        if head is None:
            kv = _len(b"\x0a", key.encode()) + b"\x12\x09\x21"
            head = self._floats[key] = b"\x4a" + _varint(len(kv) + 8) + kv
        return head

    def attributes(self, attrs: dict[str, Any]) -> bytes:
        """Attributes of any types by key (a None left out): a float packed after its key's head (never looked up:
        1.0 == 1), a unique key's string after the head kept for its length, any other value encoded (and kept
        where it may recur, by its type as well)."""
        parts: list[bytes] = []
        for k, v in attrs.items():
            t = type(v)
            if v is None:
                continue
            if t is float:
                parts += (self.float_head(k), D(v))
            elif t is str and k in self._unique:
                data = v.encode()
                parts += (self.unique_heads(k)[len(data)], data)
            elif (t is str and len(v) <= 200) or t is int or (t is tuple and all(type(x) is str for x in v)):
                kept = self._typed.get((k, t))  # by its type as well: 1 is not True
                if kept is None:
                    kept = self._typed[(k, t)] = {}
                kv = kept.get(v)
                if kv is None:
                    if len(kept) >= _CACHE_MAX:
                        kept.clear()
                    kv = kept[v] = key_value(b"\x4a", k, v)
                parts.append(kv)
            else:
                parts.append(key_value(b"\x4a", k, v))
        return b"".join(parts)

    def event(self, name: str) -> tuple[bytes, bytes]:
        """An event's (11) bytes before and after its time (Event.time_unix_nano 1, fixed64), its name being 2."""
        ev = self._events.get(name)
        if ev is None:
            field = _len(b"\x12", name.encode())
            ev = self._events[name] = (b"\x5a" + _varint(9 + len(field)) + b"\x09", field)
        return ev


class Batcher:
    """The bounded queue of finished spans and the thread that exports them in batches (the SDK's BSP, simpler:
    `add` is a deque append, and wakes the thread only when a batch is full)."""

    def __init__(self, encoder: Encoder, sender: Any, on_drop: Callable[[str, int], None]) -> None:
        num = _int_env
        self.max_queue = num("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.batch = min(num("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), self.max_queue)
        self.delay_s = num("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.encoder, self.sender, self._on_drop = encoder, sender, on_drop
        self.queue: deque[bytes] = deque()  # written spans (Tracing.spans: appended to directly short of a batch)
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._flush_asked = 0
        self._flush_done = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def add(self, span: bytes) -> None:
        """A finished span (on the loop: never waits; a full queue drops it, counted)."""
        q = self.queue
        n = len(q)
        if n >= self.max_queue:
            self._on_drop("queue_full", 1)
            return
        q.append(span)
        if n + 1 == self.batch:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            with self._flushed:
                asked = self._flush_asked
            self._export_all()
            with self._flushed:
                self._flush_done = asked
                self._flushed.notify_all()
            if self._stop:
                return

    def _export_all(self) -> None:
        """Export what is queued now, in batches; what comes in meanwhile waits for the next wake (else each send
        would be followed by another of the few spans that came in during it: many small requests)."""
        q = self.queue
        left = len(q)
        while left > 0:
            n = min(self.batch, left)
            left -= n
            batch = list(islice(iter(q.popleft, None), n))  # popped in C (n <= len(q): only this thread pops)
            try:
                self.sender.send(self.encoder.request(batch))
            except Exception:  # a receiver down or slow: these spans are lost, counted; the next batch tries again
                self._on_drop("export_failed", len(batch))

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export what is queued now (blocking: not on the loop); True when done in time."""
        with self._flushed:
            self._flush_asked += 1
            target = self._flush_asked
            self._wake.set()
            return self._flushed.wait_for(lambda: self._flush_done >= target, timeout_s)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Export what is queued, then stop the thread and close the connection (blocking)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout_s)
        self.sender.close()


def _int_env(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, "") or default))
    except ValueError:
        return default
