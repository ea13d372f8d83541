"""OpenTelemetry traces (observability/tracing.py), received by a real OTLP/HTTP receiver built on the official
protobufs (tests/support/otlp_receiver.py): the span tree of a streamed chat, of a /v1/messages call with one
retry and of a queued request; a client's traceparent continued; each attempt's child traceparent on the engine's
request; the trace ids in the access log; and tracing off importing nothing of OpenTelemetry."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import ONE_BACKEND, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, refused

pytest.importorskip("opentelemetry.proto", reason="the official OTLP protobufs the receiver is built on (dev extra)")
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_grpc_receiver, otlp_receiver

ROOT = Path(__file__).resolve().parents[2]
ENGINE = "http://engine-a.test"
ONE_MESSAGE = {"model": "pm", "messages": [{"role": "user", "content": "x"}]}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def tracing_section(r: OtlpReceiver, extra: str = "", protocol: str = "http") -> str:
    return f"tracing: {{enabled: true, endpoint: '{r.endpoint}', protocol: {protocol}{extra}}}\n"


def chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_stream() -> FakeAnswer:
    parts = [
        chunk({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        chunk({"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
        chunk({"id": "c1", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}),
        chunk({"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}),
        b"data: [DONE]\n\n",
    ]
    return FakeAnswer.sse(*parts)


def chat_whole(delay_s: float = 0.0) -> FakeAnswer:
    body = {
        "id": "c2",
        "object": "chat.completion",
        "model": "upstream-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
    a = FakeAnswer.json(body)
    return FakeAnswer(a.status, a.headers, a.chunks, delay_s)


async def flushed(app: Any, r: OtlpReceiver, n: int) -> list[ReceivedSpan]:
    """The gateway's batched spans exported now, and at least `n` received."""
    assert app.gw.tracing is not None
    await asyncio.to_thread(app.gw.tracing.force_flush)
    for _ in range(100):
        if len(r.spans) >= n:
            break
        await asyncio.sleep(0.02)
    return list(r.spans)


def parent_of(traceparent: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C traceparent the engine got; it must say sampled (flag 01)."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and int(flags, 16) & 1, traceparent
    return trace_id, span_id


def one(spans: list[ReceivedSpan], **match: Any) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.name, s.kind) for s in spans])
    return found[0]


async def test_a_streamed_chat_is_one_server_span_with_a_client_span_whose_traceparent_reaches_the_engine() -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_stream()})
    with otlp_receiver() as r:
        async with gateway_client(make_config(ONE_BACKEND + tracing_section(r)), upstream=up) as (client, app):
            resp = await client.post(
                "/v1/chat/completions",
                json={"model": "pm", "stream": True, "messages": [{"role": "user", "content": "secret prompt"}]},
            )
            assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
            spans = await flushed(app, r, 2)
    root = one(spans, kind="server")
    attempt = one(spans, kind="client")
    assert root.name == "chat public-model" and attempt.name == "chat upstream-model"
    assert attempt.trace_id == root.trace_id and attempt.parent_id == root.span_id and root.parent_id == ""
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "public-model"
    assert a["gen_ai.response.model"] == "upstream-model"
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (7, 2)
    assert a["gateway.key.name"] == "alice" and a["gateway.priority_class"] == "default"
    assert a["gateway.stream"] is True and a["gateway.cancelled"] is False and a["gateway.retries"] == 0
    assert a["gateway.ttft_s"] > 0 and [n for n, _ in root.events] == ["gen_ai.first_token"]
    assert a["http.response.status_code"] == 200 and a["gateway.request_id"] == resp.headers["x-request-id"]
    b = attempt.attributes
    assert (b["server.address"], b["server.port"], b["gen_ai.provider.name"]) == ("engine-a.test", 80, "vllm")
    assert (b["gateway.deployment"], b["gateway.attempt"]) == ("engine-a", 1)
    assert b["gen_ai.request.model"] == "upstream-model"
    assert root.start_ns <= attempt.start_ns <= attempt.end_ns <= root.end_ns
    assert root.resource["service.name"] == "llm-gateway"
    # the engine's request carries the attempt's span as its parent: its own spans join the trace
    assert parent_of(up.calls[0].headers["traceparent"]) == (root.trace_id, attempt.span_id)
    # no prompt, no key on any span unless content capture is on
    text = json.dumps([s.attributes for s in spans])
    assert "secret prompt" not in text and "sk-test" not in text and "engine-secret" not in text


async def test_an_incoming_traceparent_is_continued_and_content_is_captured_only_when_asked() -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_whole()})
    with otlp_receiver() as r:
        cfg = make_config(ONE_BACKEND + tracing_section(r, ", capture_content: true"))
        async with gateway_client(cfg, upstream=up) as (client, app):
            resp = await client.post(
                "/v1/chat/completions",
                json={"model": "public-model", "messages": [{"role": "user", "content": "the prompt"}]},
                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=abc"},
            )
            assert resp.status_code == 200, resp.text
            spans = await flushed(app, r, 2)
    root = one(spans, kind="server")
    attempt = one(spans, kind="client")
    assert (root.trace_id, root.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert attempt.trace_id == CLIENT_TRACE
    assert parent_of(up.calls[0].headers["traceparent"]) == (CLIENT_TRACE, attempt.span_id)
    assert up.calls[0].headers["tracestate"] == "vendor=abc"
    assert root.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert "the prompt" in root.attributes["gen_ai.input.messages"]
    assert '"hi"' in root.attributes["gen_ai.output.messages"]


MESSAGES_CONFIG = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}", priority: interactive}
routing: {retries: 2, backoff_base_ms: 0}
backends:
  - name: vllm-a
    engine: vllm
    url: http://vllm-a.test:8000
  - name: vllm-b
    engine: vllm
    url: http://vllm-b.test:8001
models:
  - name: public-model
    strategy: priority
    deployments:
      - {backend: vllm-a, model: upstream-model, format: safetensors, priority: 0}
      - {backend: vllm-b, model: upstream-model, format: safetensors, priority: 1}
"""


async def test_a_messages_call_with_one_retry_has_two_attempt_spans_the_first_failed() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "hi"}],
        "model": "upstream-model",
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    up = FakeUpstream(
        {
            ("POST", "http://vllm-a.test:8000/v1/messages"): refused(),
            ("POST", "http://vllm-b.test:8001/v1/messages"): FakeAnswer.json(message),
        }
    )
    with otlp_receiver() as r:
        async with gateway_client(make_config(MESSAGES_CONFIG + tracing_section(r)), upstream=up) as (client, app):
            resp = await client.post(
                "/v1/messages",
                json={"model": "public-model", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}]},
            )
            assert resp.status_code == 200, resp.text
            spans = await flushed(app, r, 3)
    root = one(spans, kind="server")
    assert root.name == "chat public-model" and root.attributes["gateway.retries"] == 1
    assert root.attributes["gateway.attempts"] == 2 and root.attributes["gateway.priority_class"] == "interactive"
    assert root.attributes["gen_ai.response.finish_reasons"] == ["end_turn"] and not root.error
    attempts = sorted((s for s in spans if s.kind == "client"), key=lambda s: s.attributes["gateway.attempt"])
    assert [s.parent_id for s in attempts] == [root.span_id, root.span_id]
    first, second = attempts
    assert first.attributes["gateway.deployment"] == "vllm-a" and first.error
    assert first.attributes["error.type"] == "upstream_unreachable" and first.attributes["gateway.retryable"]
    assert second.attributes["gateway.deployment"] == "vllm-b" and not second.error
    assert second.attributes["server.port"] == 8001 and first.end_ns <= second.start_ns
    # each attempt's request named its own span as the engine's parent
    assert [c.headers["traceparent"].split("-")[2] for c in up.calls] == [first.span_id, second.span_id]


QUEUE_CONFIG = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
backends:
  - name: engine-a
    engine: vllm
    url: http://engine-a.test
    max_concurrency: 1
    max_queue: 4
models:
  - name: public-model
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors}
"""


async def test_a_queued_request_has_a_queue_span_before_its_attempt() -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_whole(delay_s=0.3)})
    body = {"model": "public-model", "messages": [{"role": "user", "content": "x"}]}
    with otlp_receiver() as r:
        async with gateway_client(make_config(QUEUE_CONFIG + tracing_section(r)), upstream=up) as (client, app):
            first = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await asyncio.sleep(0.1)
            second = await client.post("/v1/chat/completions", json=body)
            assert (await first).status_code == 200 and second.status_code == 200
            spans = await flushed(app, r, 5)
    queued_root = one(spans, kind="server", trace_id=one(spans, name="gateway.queue").trace_id)
    queue = one(spans, name="gateway.queue")
    attempt = one(spans, kind="client", trace_id=queued_root.trace_id)
    assert queue.parent_id == attempt.parent_id == queued_root.span_id
    assert queue.attributes["gateway.queue_wait_s"] > 0.1 and queued_root.attributes["gateway.queue_wait_s"] > 0.1
    assert queue.end_ns <= attempt.start_ns + 1_000_000
    assert queue.end_ns - queue.start_ns > 100_000_000


async def test_the_access_log_carries_the_trace_and_span_ids(caplog: pytest.LogCaptureFixture) -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_whole()})
    cfg_text = ONE_BACKEND.replace("server: {access_log: false}", "server: {access_log: true}")
    with otlp_receiver() as r, caplog.at_level(logging.INFO, logger="gateway.access"):
        async with gateway_client(make_config(cfg_text + tracing_section(r)), upstream=up) as (client, app):
            resp = await client.post("/v1/chat/completions", json=ONE_MESSAGE)
            assert resp.status_code == 200, resp.text
            spans = await flushed(app, r, 1)
    root = one(spans, kind="server")
    fields = [rec.fields for rec in caplog.records if rec.name == "gateway.access"]  # type: ignore[attr-defined]
    assert fields and fields[-1]["trace_id"] == root.trace_id and fields[-1]["span_id"] == root.span_id
    assert fields[-1]["request_id"] == resp.headers["x-request-id"]


async def test_spans_go_over_otlp_grpc_too_and_sampling_zero_sends_none() -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): [chat_whole(), chat_whole()]})
    with otlp_grpc_receiver() as r:
        async with gateway_client(make_config(ONE_BACKEND + tracing_section(r, protocol="grpc")), upstream=up) as (
            client,
            app,
        ):
            assert (await client.post("/v1/chat/completions", json=ONE_MESSAGE)).status_code == 200
            spans = await flushed(app, r, 2)
        cfg = make_config(ONE_BACKEND + tracing_section(r, ", sampling_ratio: 0", protocol="grpc"))
        async with gateway_client(
            cfg, upstream=FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_whole()})
        ) as (
            client,
            app,
        ):
            assert (await client.post("/v1/chat/completions", json=ONE_MESSAGE)).status_code == 200
            await flushed(app, r, 0)
    assert sorted(s.kind for s in spans) == ["client", "server"] and len(r.spans) == 2
    assert one(spans, kind="client").parent_id == one(spans, kind="server").span_id


async def test_an_unsampled_client_trace_still_reaches_the_engine_and_exports_nothing() -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_whole()})
    with otlp_receiver() as r:
        async with gateway_client(make_config(ONE_BACKEND + tracing_section(r)), upstream=up) as (client, app):
            resp = await client.post(
                "/v1/chat/completions", json=ONE_MESSAGE, headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"}
            )
            assert resp.status_code == 200, resp.text
            await flushed(app, r, 0)
    version, trace_id, span_id, flags = up.calls[0].headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "00") and span_id not in (CLIENT_SPAN, "0" * 16)
    assert r.spans == []


async def test_the_standard_otel_variables_fill_what_the_config_leaves_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_whole()})
    with otlp_receiver() as r:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{r.endpoint}/v1/traces")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-eu-1")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
        async with gateway_client(make_config(ONE_BACKEND + "tracing: {enabled: true}\n"), upstream=up) as (
            client,
            app,
        ):
            assert (await client.post("/v1/chat/completions", json=ONE_MESSAGE)).status_code == 200
            spans = await flushed(app, r, 2)
    root = one(spans, kind="server")
    assert root.resource["service.name"] == "gateway-eu-1"
    assert root.resource["deployment.environment"] == "staging"


PROBE = """
import sys, threading
from llm_gateway.settings.loader import parse_config
from llm_gateway.app import create_app
create_app(parse_config(sys.argv[1], "t.yaml", {}), probes=False)
print(any(t.name == "otlp-export" for t in threading.enumerate()),
      any(m.startswith(("opentelemetry", "grpc")) for m in sys.modules))
"""


@pytest.mark.parametrize("enabled", [False, True])
def test_no_opentelemetry_package_is_imported_and_the_export_thread_runs_only_with_tracing_on(
    enabled: bool, tmp_path: Path
) -> None:
    text = (
        "server: {access_log: false}\nauth: {mode: none}\n"
        "backends: [{name: e, engine: vllm, url: 'http://127.0.0.1:9'}]\n"
        "models: [{name: m, deployments: [{backend: e, model: m, format: safetensors}]}]\n"
        f"tracing: {{enabled: {str(enabled).lower()}, endpoint: 'http://127.0.0.1:9'}}\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(  # in tmp_path: the app's data dir (a relative default) is made there
        [sys.executable, "-c", PROBE, text],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,
        env=env,
    )
    assert out.stdout.split() == [str(enabled), "False"], out.stderr


async def test_tracing_off_makes_no_trace_objects() -> None:
    up = FakeUpstream({("POST", f"{ENGINE}/v1/chat/completions"): chat_whole()})
    async with gateway_client(make_config(ONE_BACKEND), upstream=up) as (client, app):
        assert app.gw.tracing is None
        resp = await client.post("/v1/chat/completions", json=ONE_MESSAGE)
        assert resp.status_code == 200
    assert "traceparent" not in up.calls[0].headers


def anthropic_event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def messages_stream(stop_reason: str) -> FakeAnswer:
    """vLLM's native /v1/messages stream (the gateway relays it as it is)."""
    message = {"id": "m1", "type": "message", "role": "assistant", "content": [], "model": "upstream-model"}
    message |= {"stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 0}}
    block = {"type": "text", "text": ""}
    return FakeAnswer.sse(
        anthropic_event("message_start", {"type": "message_start", "message": message}),
        anthropic_event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        anthropic_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        ),
        anthropic_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        anthropic_event(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 1}},
        ),
        anthropic_event("message_stop", {"type": "message_stop"}),
    )


def chat_stream_ending(finish: str) -> FakeAnswer:
    return FakeAnswer.sse(
        chunk({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]}),
        chunk({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        chunk({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
        b"data: [DONE]\n\n",
    )


STREAMS = {  # API -> (client path, request body, engine path, engine stream, finish reasons on the span)
    "chat": ("/v1/chat/completions", ONE_MESSAGE, "/v1/chat/completions", chat_stream_ending("length"), ["length"]),
    "messages": (
        "/v1/messages",
        {"model": "pm", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        "/v1/messages",
        messages_stream("max_tokens"),
        ["max_tokens"],
    ),
    # translated from the engine's chat stream: a Response that ran to its end
    "responses": (
        "/v1/responses",
        {"model": "pm", "input": "x"},
        "/v1/chat/completions",
        chat_stream_ending("stop"),
        ["completed"],
    ),
}


@pytest.mark.parametrize("api", list(STREAMS))
async def test_a_streams_finish_reasons_are_on_the_request_span(
    api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a stored response goes to the default data dir (./data): not the checkout's
    path, body, engine_path, stream, reasons = STREAMS[api]
    up = FakeUpstream({("POST", f"{ENGINE}{engine_path}"): stream})
    with otlp_receiver() as r:
        async with gateway_client(make_config(ONE_BACKEND + tracing_section(r)), upstream=up) as (client, app):
            resp = await client.post(path, json={**body, "stream": True})
            assert resp.status_code == 200, resp.text
            spans = await flushed(app, r, 2)
    root = one(spans, kind="server")
    assert root.attributes["gateway.stream"] is True
    assert root.attributes["gen_ai.response.finish_reasons"] == reasons
