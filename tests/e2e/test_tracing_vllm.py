"""One trace from the client through the gateway into a real engine: vLLM (CPU build) started with
`--otlp-traces-endpoint` exports its own request span to the same OTLP receiver as the gateway, and it joins
the gateway's trace under the attempt's span (the child `traceparent` the gateway sent it)."""

from __future__ import annotations

import asyncio
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from llm_gateway.app import create_app
from llm_gateway.settings.loader import parse_config
from tests.conftest import VLLM_KEY, engines_started
from tests.support.real_engines import VllmServer

pytest.importorskip("opentelemetry.proto", reason="the official OTLP protobufs the receiver is built on (dev extra)")
from tests.support.otlp_receiver import ReceivedSpan, otlp_grpc_receiver

pytestmark = pytest.mark.real_engine  # its own vLLM (not the session fixture): marked here

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


async def test_vllm_spans_join_the_gateways_trace(tmp_path: Path) -> None:
    with otlp_grpc_receiver() as r:
        eng = VllmServer(
            api_key=VLLM_KEY,
            workdir=tmp_path,
            extra_args=("--otlp-traces-endpoint", r.endpoint),
            env={"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
        )
        with engines_started([eng]):
            eng.start()
            cfg = parse_config(
                textwrap.dedent(f"""
                server: {{access_log: false}}
                auth: {{mode: none}}
                backends:
                  - {{name: vllm, engine: vllm, url: '{eng.url}', api_key: {VLLM_KEY}}}
                models:
                  - name: tiny
                    deployments: [{{backend: vllm, model: tiny-llama, format: safetensors}}]
                tracing: {{enabled: true, endpoint: '{r.endpoint}', protocol: grpc}}
                """),
                "t.yaml",
                {},
            )
            app = create_app(cfg, probes=False)
            try:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=120) as c:
                    resp = await c.post(
                        "/v1/chat/completions",
                        json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                    )
                    assert resp.status_code == 200, resp.text
                assert app.gw.tracing is not None
                await asyncio.to_thread(app.gw.tracing.force_flush)
            finally:
                await app.gw.aclose()
            deadline = time.monotonic() + 30  # vLLM's batch goes out on its own schedule
            while time.monotonic() < deadline and not engine_spans(r.spans):
                await asyncio.sleep(0.2)
    ours = [s for s in r.spans if s.resource.get("service.name") == "llm-gateway"]
    attempt = next(s for s in ours if s.kind == "client")
    assert {s.trace_id for s in ours} == {CLIENT_TRACE}
    joined = engine_spans(r.spans)  # vLLM's own spans of start-up (worker init) are traces of their own
    others = [(s.name, s.resource.get("service.name")) for s in r.spans if s not in ours]
    assert joined, f"vLLM exported no span in the client's trace; its spans: {others}"
    assert [s.parent_id for s in joined] == [attempt.span_id], [(s.name, s.attributes) for s in joined]


def engine_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == CLIENT_TRACE and s.resource.get("service.name") != "llm-gateway"]
