"""The gateway's own OTLP writer and batcher (observability/otlp.py): what it writes is what the official protobufs
(opentelemetry-proto) parse, field for field and value for value; a full queue drops and counts, never waits; a
failed export is counted; only what was queued at a wake goes in that wake's batches; the sampler follows
OTEL_TRACES_SAMPLER as the SDK does."""

from __future__ import annotations

import time
from typing import Any

import pytest

from llm_gateway.observability import otlp
from llm_gateway.observability.tracing import Tracing
from llm_gateway.settings import TracingConfig

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan  # noqa: E402

KEYS = ("fixed.str", "fixed.none", "fixed.int", "fixed.bool")
OWN = ("own.int", "own.none", "own.float", "own.reasons")
SPAN: otlp.Span = (
    "chat modèle",
    otlp.CLIENT,
    bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736"),
    bytes.fromhex("00f067aa0ba902b7"),
    bytes.fromhex("1122334455667788"),
    "vendor=abc",
    1_700_000_000_123_456_789,
    1_700_000_000_987_654_321,
    KEYS,
    ("é", None, 300, True),
    OWN,
    (7, None, 0.5, ("stop",)),
    {
        "s": "x" * 300,  # a 2-byte length
        "neg": -5,
        "big": 2**62,
        "f": 0.125,
        "t": True,
        "no": False,
        "zero": 0,
        "reasons": ["stop", "length"],
        "ints": [1, 2],
    },
    (("gen_ai.first_token", 1_700_000_000_200_000_000),),
    "upstream_unreachable",
)


TID, SID = (1).to_bytes(16, "big"), (2).to_bytes(8, "big")


def value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind)


def parsed(data: bytes) -> Any:
    return pb.ExportTraceServiceRequest.FromString(data)


def test_what_the_writer_writes_is_what_the_official_protobufs_read() -> None:
    enc = otlp.Encoder({"service.name": "gw", "n": 1}, "llm_gateway")
    req = parsed(enc.request([enc.span(SPAN), enc.span(SPAN)]))  # twice: the second from the caches
    (rs,) = req.resource_spans
    assert {a.key: value(a.value) for a in rs.resource.attributes} == {"service.name": "gw", "n": 1}
    (ss,) = rs.scope_spans
    assert ss.scope.name == "llm_gateway" and len(ss.spans) == 2 and ss.spans[0] == ss.spans[1]
    s = ss.spans[0]
    assert s.name == "chat modèle" and s.kind == PbSpan.SPAN_KIND_CLIENT
    assert (s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex()) == (
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "00f067aa0ba902b7",
        "1122334455667788",
    )
    assert (s.start_time_unix_nano, s.end_time_unix_nano) == (SPAN[6], SPAN[7]) and s.trace_state == "vendor=abc"
    attrs = {a.key: value(a.value) for a in s.attributes}
    own = {"own.int": 7, "own.float": 0.5, "own.reasons": ["stop"]}
    assert attrs == {"fixed.str": "é", "fixed.int": 300, "fixed.bool": True, **own, **SPAN[12]}
    assert [(e.name, e.time_unix_nano) for e in s.events] == [("gen_ai.first_token", 1_700_000_000_200_000_000)]
    assert s.status.code == s.status.STATUS_CODE_ERROR and s.status.message == "upstream_unreachable"


def test_a_root_span_without_error_has_no_parent_and_an_unset_status() -> None:
    root = (
        "r",
        otlp.SERVER,
        (1).to_bytes(16, "big"),
        (2).to_bytes(8, "big"),
        b"",
        "",
        1,
        2,
        (),
        (),
        (),
        (),
        {},
        (),
        None,
    )
    (s,) = (
        parsed(otlp.Encoder({}, "x").request([otlp.Encoder({}, "x").span(root)])).resource_spans[0].scope_spans[0].spans
    )
    assert s.parent_span_id == b"" and s.status.code == s.status.STATUS_CODE_UNSET and s.kind == PbSpan.SPAN_KIND_SERVER
    assert s.trace_id == (1).to_bytes(16, "big") and s.span_id == (2).to_bytes(8, "big") and s.trace_state == ""


def test_an_attribute_whose_value_is_none_is_left_out() -> None:
    own = ("o", "p")
    span = ("r", otlp.SERVER, TID, SID, b"", "", 1, 2, ("k",), (None,), own, (None, 2), {"a": None, "b": 1}, (), None)
    (s,) = (
        parsed(otlp.Encoder({}, "x").request([otlp.Encoder({}, "x").span(span)])).resource_spans[0].scope_spans[0].spans
    )
    assert {a.key: value(a.value) for a in s.attributes} == {"p": 2, "b": 1}


def test_values_equal_across_types_keep_their_types_through_the_caches() -> None:
    """True == 1 == 1.0 and (True,) == (1,): the other attributes' (a dict, any types) encodings are kept by (key,
    type, value), so none may stand for another; a float's key of over 127 bytes takes a two-byte length."""
    enc = otlp.Encoder({}, "x")
    long_key = "k" * 200
    values = [1, True, 1.0, 0, False, 0.0, 2, 2.0, ("a",), (True,), (1,), [1], None]
    for _ in range(2):  # the second time from the caches
        for v in values:
            span = ("r", otlp.SERVER, TID, SID, b"", "", 1, 2, (), (), (), (), {"x": v, long_key: 0.5}, (), None)
            (s,) = parsed(enc.request([enc.span(span)])).resource_spans[0].scope_spans[0].spans
            got = {a.key: a.value for a in s.attributes}
            assert value(got[long_key]) == 0.5
            if v is None:
                assert "x" not in got
                continue
            kind = {bool: "bool_value", int: "int_value", float: "double_value"}.get(type(v), "array_value")
            assert got["x"].WhichOneof("value") == kind and value(got["x"]) == (list(v) if kind == "array_value" else v)
            if kind == "array_value":
                assert [x.WhichOneof("value") for x in got["x"].array_value.values] == [
                    {bool: "bool_value", int: "int_value", str: "string_value"}[type(x)] for x in v
                ]


def test_own_attributes_of_one_type_a_key_keep_their_types_through_the_caches() -> None:
    """Own attributes (by position) are kept by value per key, each key's values of one type: a bool, an int, a
    float and a tuple key, each with values equal across those types elsewhere, read back as their own types."""
    enc = otlp.Encoder({}, "x")
    own = ("b", "i", "f", "t", "k" * 200)
    rows = [(True, 1, 1.0, (1,), 0.5), (False, 0, 0.0, (True,), None), (None, 2, 2.0, ("a", 1), 0.25)]
    for _ in range(2):  # the second time from the caches
        for row in rows:
            span = ("r", otlp.SERVER, TID, SID, b"", "", 1, 2, (), (), own, row, {}, (), None)
            (s,) = parsed(enc.request([enc.span(span)])).resource_spans[0].scope_spans[0].spans
            got = {a.key: a.value for a in s.attributes}
            want = {k: v for k, v in zip(own, row, strict=True) if v is not None}
            assert list(got) == list(want)
            for k, v in want.items():
                kind = {bool: "bool_value", int: "int_value", float: "double_value", tuple: "array_value"}[type(v)]
                assert got[k].WhichOneof("value") == kind and value(got[k]) == (list(v) if kind == "array_value" else v)


WRITTEN = otlp.Encoder({}, "x").span(SPAN)


class Sender:
    def __init__(self, fail: bool = False, slow_s: float = 0.0) -> None:
        self.batches: list[int] = []
        self.fail, self.slow_s = fail, slow_s
        self.closed = False

    def send(self, body: bytes) -> None:
        time.sleep(self.slow_s)
        if self.fail:
            raise OSError("refused")
        self.batches.append(len(parsed(body).resource_spans[0].scope_spans[0].spans))

    def close(self) -> None:
        self.closed = True


def test_a_full_queue_drops_and_counts_without_waiting_and_a_failed_export_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    drops: list[tuple[str, int]] = []
    b = otlp.Batcher(otlp.Encoder({}, "x"), Sender(fail=True), lambda why, n: drops.append((why, n)))
    t = time.perf_counter()
    for _ in range(10):
        b.add(WRITTEN)
    assert time.perf_counter() - t < 0.05
    assert drops == [("queue_full", 1)] * 6
    assert b.force_flush(5)
    assert drops[-1] == ("export_failed", 4)
    b.shutdown()


def test_a_wake_exports_what_was_queued_and_leaves_what_came_in_during_the_send_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    sender = Sender(slow_s=0.1)
    b = otlp.Batcher(otlp.Encoder({}, "x"), sender, lambda why, n: None)
    b.add(WRITTEN)
    b.add(WRITTEN)  # a full batch: the thread wakes and sends it (0.1 s)
    time.sleep(0.03)
    b.add(WRITTEN)  # during that send
    time.sleep(0.2)
    assert sender.batches == [2]  # not a send of its own right after: it waits for the next wake
    assert b.force_flush(5)
    b.shutdown()
    assert sender.batches == [2, 1] and sender.closed


@pytest.mark.parametrize(
    ("sampler", "arg", "new_kept", "unsampled_parent_kept"),
    [
        ("parentbased_always_on", None, True, False),
        ("always_on", None, True, True),
        ("parentbased_always_off", None, False, False),
        ("parentbased_traceidratio", "0", False, False),
        ("traceidratio", "1", True, True),
    ],
)
def test_otel_traces_sampler_decides_as_the_sdk_does(
    monkeypatch: pytest.MonkeyPatch, sampler: str, arg: str | None, new_kept: bool, unsampled_parent_kept: bool
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    tr = Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9"))
    try:
        assert tr.begin(None, {}).sampled is new_kept  # type: ignore[arg-type]
        parent = {b"traceparent": b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}
        got = tr.begin(None, parent)  # type: ignore[arg-type]
        assert got.sampled is unsampled_parent_kept and got.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    finally:
        tr.shutdown()


def test_the_sampling_ratio_keeps_the_share_of_new_traces_the_sdk_would() -> None:
    tr = Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9", sampling_ratio=0.25))
    try:
        kept = sum(tr.begin(None, {}).sampled for _ in range(20_000))  # type: ignore[arg-type]
        assert 4_400 < kept < 5_600
    finally:
        tr.shutdown()


@pytest.mark.parametrize(
    "header",
    [
        b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
        b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 with more fields
        b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short
    ],
)
def test_an_invalid_traceparent_starts_a_new_trace(header: bytes) -> None:
    tr = Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9"))
    try:
        got = tr.begin(None, {b"traceparent": header})  # type: ignore[arg-type]
        assert got.parent == b"" and got.trace_id.hex() != "4bf92f3577b34da6a3ce929d0e0e4736"
    finally:
        tr.shutdown()
