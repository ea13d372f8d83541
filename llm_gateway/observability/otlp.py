"""OTLP trace export without the OpenTelemetry SDK on the request path: finished spans as plain tuples in a bounded
queue, encoded in the export thread straight to `ExportTraceServiceRequest` protobuf bytes, sent in batches by one of
otlp_senders.py's senders (OTLP/HTTP or OTLP/gRPC).

Why not the SDK: its span objects and its OTLP encoding (message objects per attribute) cost ~54 µs per span on
this VM, 1.56x-2.02x the CPU of an untraced request at 100 % sampling (issue 40). Here the request path appends one
tuple per span (`Span`) and the batch thread writes the wire format itself; a span's attributes mostly recur
(model, deployment, engine, route), so each value is encoded once per key and kept (at most 1,024 a key), but for
the keys whose values are each span's own (a request id: `Encoder`'s `unique`), written as they come.

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

#: a finished span: name, trace id, span id, parent span id (0: a root), kind (OTLP's: 1 internal, 2 server,
#: 3 client), start and end (unix ns), its fixed attributes (a constant tuple of keys and a tuple of their values,
#: scalars of one type a key, a None value left out: encoded once per distinct values and kept, by the values
#: tuple, where True == 1 == 1.0), its other attributes (a None value left
#: out too), events ((name, unix ns), ...), error (None: no error status), tracestate (the W3C header's value,
#: "" when none)
Span = tuple[
    str,
    int,
    int,
    int,
    int,
    int,
    int,
    tuple[str, ...],
    tuple[Any, ...],
    dict[str, Any],
    tuple[tuple[str, int], ...],
    str | None,
    str,
]
INTERNAL, SERVER, CLIENT = 1, 2, 3
_Q = struct.Struct("<Q").pack
_D = struct.Struct("<d").pack
_VARINT1 = [bytes((i,)) for i in range(128)]
_MASK64 = (1 << 64) - 1
_IDS = struct.Struct(">HQQHQ").pack  # trace_id 1 (tag, length, 16 bytes), span_id 2 (tag, length, 8 bytes)
_PARENT = struct.Struct(">HQ").pack  # parent_span_id 4
_IDS_PARENT = struct.Struct(">HQQHQHQ").pack  # _IDS and _PARENT in one
_TIMES = struct.Struct("<BBBQBQ").pack  # kind 6 (one byte: 1-5), start 7 and end 8 (fixed64)
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
        return b"\x21" + _D(value)
    if t is list or t is tuple:
        return _len(b"\x2a", b"".join(_len(b"\x0a", _any(v)) for v in value))
    return _len(b"\x0a", str(value).encode())


def key_value(tag: bytes, key: str, value: Any) -> bytes:
    """A KeyValue (key 1, value 2) as field `tag` of its message (a span's attributes are field 9)."""
    return _len(tag, _len(b"\x0a", key.encode()) + _len(b"\x12", _any(value)))


class Encoder:
    """Spans to an ExportTraceServiceRequest: one ResourceSpans (the process's resource) with one ScopeSpans."""

    def __init__(self, resource: dict[str, Any], scope: str, unique: Iterable[str] = ()) -> None:
        """`unique`: the attribute keys whose values differ from span to span (a request id, captured content):
        their values are written as they come, never kept."""
        res = b"".join(key_value(b"\x0a", k, v) for k, v in resource.items())  # Resource.attributes 1
        self._resource = _len(b"\x0a", res)  # ResourceSpans.resource 1
        self._scope = _len(b"\x0a", _len(b"\x0a", scope.encode()))  # ScopeSpans.scope 1 (InstrumentationScope.name)
        self._unique = frozenset(unique)
        #: key -> value -> the encoded attribute (a list's value as a tuple; see _attribute for what is kept), at
        #: most _CACHE_MAX values a key
        self._kv: defaultdict[str, dict[Any, bytes]] = defaultdict(dict)
        self._unique_heads: dict[tuple[str, int], bytes] = {}  # (a unique key, its value's length) -> _unique_head
        self._floats: dict[str, bytes] = {}  # key -> the attribute's bytes before its 8-byte double
        #: id of a keys tuple (a module constant) -> its values -> their encoded attributes
        self._blocks: dict[int, dict[tuple[Any, ...], bytes]] = {}
        self._names: dict[str, bytes] = {}  # a span's name -> its field
        self._events: dict[str, tuple[bytes, bytes]] = {}  # an event's name -> its bytes before and after its time
        #: id of an attempt span's values tuple -> (the values, its name, its keys, the name's and the block's bytes)
        self._by_id: dict[int, tuple[tuple[Any, ...], str, tuple[str, ...], bytes, bytes]] = {}

    def request(self, spans: list[Span]) -> bytes:
        """The ExportTraceServiceRequest of `spans` (resource_spans 1 -> scope_spans 2 -> spans 2), joined once (a
        batch is ~300 KB: each field wrapped around it would copy it)."""
        spans_bytes = b"".join(map(self.span, spans))
        scope_spans = b"\x12" + _varint(len(self._scope) + len(spans_bytes))
        n = len(self._resource) + len(scope_spans) + len(self._scope) + len(spans_bytes)
        return b"".join((b"\x0a", _varint(n), self._resource, scope_spans, self._scope, spans_bytes))

    def span(self, s: Span) -> bytes:
        """One Span message, as ScopeSpans.spans (field 2). What recurs is encoded once and kept: the name, the
        fixed attributes' block, an attribute's key (and, for strings, ints and bools, its value), an event's name;
        what varies (ids, times, floats) is packed by one struct each (a parent and the ids by one)."""
        name, trace_id, span_id, parent, kind, start, end, keys, values, attrs, events, error, state = s
        # trace_id 1, span_id 2 (big-endian, as their hex), [trace_state 3], [parent_span_id 4], name 5, kind 6,
        # start 7 and end 8 (fixed64)
        if state:
            ids = _IDS(0x0A10, trace_id >> 64, trace_id & _MASK64, 0x1208, span_id) + _len(b"\x1a", state.encode())
            if parent:
                ids += _PARENT(0x2208, parent)
        elif parent:
            ids = _IDS_PARENT(0x0A10, trace_id >> 64, trace_id & _MASK64, 0x1208, span_id, 0x2208, parent)
        else:
            ids = _IDS(0x0A10, trace_id >> 64, trace_id & _MASK64, 0x1208, span_id)
        if not attrs and not events and error is None:  # an attempt's span: its name and values recur as the same
            # objects (Tracing.clients), so their encoded bytes are kept by identity: no tuple hashed, one lookup
            kept = self._by_id.get(id(values))
            if kept is None or kept[0] is not values or kept[1] is not name or kept[2] is not keys:
                if len(self._by_id) >= _CACHE_MAX:
                    self._by_id.clear()
                kept = (values, name, keys, self._head(name), self._block(keys, values))  # holds them: ids stay theirs
                self._by_id[id(values)] = kept
            body = b"".join((ids, kept[3], _TIMES(0x30, kind, 0x39, start, 0x41, end), kept[4]))
            tag = _SPAN_TAGS.get(len(body))
            return (_span_tag(len(body)) if tag is None else tag) + body
        head = self._names.get(name)
        if head is None:
            head = self._head(name)
        blocks = self._blocks.get(id(keys))
        block = blocks.get(values) if blocks is not None else None
        if block is None:
            block = self._block(keys, values)
        parts = [ids, head, _TIMES(0x30, kind, 0x39, start, 0x41, end), block]
        if attrs:  # its other attributes (9): a value seen before under its key is one lookup (a key's cache made at
            # its first); else a float is packed (never looked up: 1.0 == 1), None is no attribute, a unique key's
            # string is written as it comes
            kvs = self._kv
            for k, v in attrs.items():
                if type(v) is float:  # a time or a wait: seldom the same twice
                    kv = self._floats.get(k)
                    if kv is None:
                        kv = self._floats[k] = _float_head(k)
                    parts += (kv, _D(v))
                    continue
                try:
                    kv = kvs[k].get(v)
                except TypeError:  # a list: kept as a tuple
                    kv = kvs[k].get(tuple(v)) if type(v) is list else None
                if kv is not None:
                    parts.append(kv)  # list.append by name: 3.11 specializes it (a bound method is a call)
                elif v is not None:
                    parts.append(self._new_attribute(k, v))
        for ev_name, at in events:  # events 11: Event.time_unix_nano 1, name 2
            ev = self._events.get(ev_name)
            if ev is None:
                field = _len(b"\x12", ev_name.encode())
                ev = self._events[ev_name] = (b"\x5a" + _varint(9 + len(field)) + b"\x09", field)
            parts += (ev[0], _Q(at), ev[1])
        if error is not None:  # status 15: Status.message 2, code 3 (2: error)
            parts.append(_len(b"\x7a", _len(b"\x12", error.encode()) + b"\x18\x02"))
        body = b"".join(parts)
        n = len(body)
        tag = _SPAN_TAGS.get(n)  # its tag and length: spans' lengths recur
        if tag is None:
            tag = _span_tag(n)
        return tag + body

    def _head(self, name: str) -> bytes:
        """A span's name field (5), kept."""
        head = self._names.get(name)
        if head is None:
            if len(self._names) >= _CACHE_MAX:
                self._names.clear()
            head = self._names[name] = _len(b"\x2a", name.encode())
        return head

    def _block(self, keys: tuple[str, ...], values: tuple[Any, ...]) -> bytes:
        """The fixed attributes' KeyValues (9), kept by their values (a span's request facts recur)."""
        if not keys:
            return b""
        blocks = self._blocks.get(id(keys))
        if blocks is None:
            blocks = self._blocks[id(keys)] = {}
        kept = blocks.get(values)
        if kept is None:
            kept = b"".join(key_value(b"\x4a", k, v) for k, v in zip(keys, values, strict=True) if v is not None)
            if len(blocks) >= _CACHE_MAX:
                blocks.clear()
            blocks[values] = kept
        return kept

    def _new_attribute(self, k: str, v: Any) -> bytes:
        """An attribute not found in its key's cache: a unique key's string written as it comes (its head kept by
        the string's length), anything else encoded and kept where it may recur (_attribute)."""
        if type(v) is str and k in self._unique:  # KeyValue: key 1, value 2 (AnyValue.string_value 1)
            data = v.encode()
            head = self._unique_heads.get((k, len(data)))  # its tag, lengths and key: by the value's length
            if head is None:
                head = _unique_head(self._unique_heads, k, len(data))
            return head + data
        return _attribute(self._kv[k], k, tuple(v) if type(v) is list else v)


#: a span's length -> ScopeSpans.spans' tag and that length (at most _CACHE_MAX kept)
_SPAN_TAGS: dict[int, bytes] = {}


def _span_tag(n: int) -> bytes:
    tag = b"\x12" + _varint(n)
    if len(_SPAN_TAGS) >= _CACHE_MAX:
        _SPAN_TAGS.clear()
    _SPAN_TAGS[n] = tag
    return tag


def _float_head(k: str) -> bytes:
    """A double attribute's bytes before its 8-byte value: the KeyValue's tag and length, its key 1 and value 2
    (AnyValue.double_value 4)."""
    head = _len(b"\x0a", k.encode()) + b"\x12\x09\x21"
    return b"\x4a" + _varint(len(head) + 8) + head


def _unique_head(heads: dict[tuple[str, int], bytes], k: str, n: int) -> bytes:
    """A unique key's string attribute of `n` bytes, all but the string: the KeyValue's tag and length, its key 1,
    and value 2's tag and length (AnyValue.string_value 1's tag and length); kept by (key, n) (at most _CACHE_MAX)."""
    key = _len(b"\x0a", k.encode())
    value_head = b"\x12" + _varint(n + 1 + len(_varint(n))) + b"\x0a" + _varint(n)
    head = b"\x4a" + _varint(len(key) + len(value_head) + n) + key + value_head
    if len(heads) >= _CACHE_MAX:
        heads.clear()
    heads[(k, n)] = head
    return head


def _attribute(cache: dict[Any, bytes], k: str, v: Any) -> bytes:
    """An attribute not kept yet: encoded, and kept in its key's `cache` when its value may recur (a string of up to
    200 characters, an int, a tuple of strings). Not bools, nor the ints 0 and 1, nor other tuples: True == 1 ==
    1.0, so a lookup could not tell them apart (floats are never looked up)."""
    t = type(v)
    kv = key_value(b"\x4a", k, v)
    if (
        (t is str and len(v) <= 200)
        or (t is int and v not in (0, 1))
        or (t is tuple and all(type(x) is str for x in v))
    ):
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[v] = kv
    return kv


class Batcher:
    """The bounded queue of finished spans and the thread that exports them in batches (the SDK's BSP, simpler:
    `add` is a deque append, and wakes the thread only when a batch is full)."""

    def __init__(self, encoder: Encoder, sender: Any, on_drop: Callable[[str, int], None]) -> None:
        num = _int_env
        self.max_queue = num("OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.batch = min(num("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), self.max_queue)
        self.delay_s = num("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.encoder, self.sender, self._on_drop = encoder, sender, on_drop
        self._queue: deque[Span] = deque()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._flush_asked = 0
        self._flush_done = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def add(self, span: Span) -> None:
        """A finished span (on the loop: never waits; a full queue drops it, counted)."""
        q = self._queue
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
        q = self._queue
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
