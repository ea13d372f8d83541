"""LMDeploy emulator against the reference's documented shapes and the LMDeploy source (HEAD by default;
older releases through the ``version`` knob where /health and the 401 differ)."""

from __future__ import annotations

import asyncio
import json

import pytest
from emu_helpers import chat, keys, request, running

from llm_gateway_emulators import Emulator, EmulatorConfig

pytestmark = pytest.mark.asyncio
ENGINE = "lmdeploy"
FLAT = ["message", "type", "code", "param", "object"]
KEY = {"Authorization": "Bearer lm-key"}
LEGACY_401 = {
    "detail": {
        "error": {
            "message": "Please request with valid api key!",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
}


async def test_health_state_machine() -> None:
    async with running(ENGINE, load_delay_s=0.3) as emu:
        got = await request(emu.url, path="/health")
        assert got.status == 503 and got.json()["status"] == "initializing"
        await asyncio.sleep(0.35)
        got = await request(emu.url, path="/health")
        assert got.status == 200 and got.json() == {"status": "healthy", "message": "Engine is healthy."}
        emu.config.health = "sleeping"
        assert (await request(emu.url, path="/health")).json()["status"] == "sleeping"
        assert (await request(emu.url, path="/health")).status == 200
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2))
        assert got.status == 503 and got.json()["type"] == "server_error" and "sleeping" in got.json()["message"]
        emu.config.health = "unhealthy"
        assert (await request(emu.url, path="/health")).status == 503


async def test_auth_covers_everything_but_health() -> None:
    async with running(ENGINE, api_key="lm-key") as emu:
        got = await request(emu.url, path="/metrics")
        assert got.status == 401 and got.json() == {
            "message": "Unauthorized.",
            "type": "authentication_error",
            "code": 401,
            "param": None,
            "object": "error",
        }
        assert (await request(emu.url, path="/health")).status == 200
        assert (await request(emu.url, path="/v1/models", headers={"X-Api-Key": "lm-key"})).status == 401
        assert (await request(emu.url, path="/v1/models", headers={"Authorization": "Bearer lm-key"})).status == 200


async def test_errors_flat_with_int_code() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/embeddings", {"model": "tiny", "input": "x"})
        assert got.status == 400 and got.json()["message"] == "Unsupported by turbomind." and keys(got.json()) == FLAT
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2, model="nope"))
        assert got.status == 404 and got.json()["message"] == "The model 'nope' does not exist."
        assert got.json()["type"] == "not_found_error"
        got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "tiny"})
        assert got.status == 400 and got.json()["message"] == "messages: Field required"


async def test_stream_shape_usage_and_done() -> None:
    async with running(ENGINE) as emu:
        got = await request(
            emu.url, "POST", "/v1/chat/completions", chat(2, True, stream_options={"include_usage": True})
        )
        events = got.events()
        assert events[0].startswith(b'data: {"id": "chatcmpl-')
        first = json.loads(events[0][6:])
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hello"} and first["usage"] is None
        assert json.loads(events[1][6:])["choices"][0]["finish_reason"] == "length"
        assert events[2].startswith(b'data: {"id":"chatcmpl-') and json.loads(events[2][6:])["choices"] == []
        assert events[3] == b"data: [DONE]"
        plain = await request(emu.url, "POST", "/v1/chat/completions", chat(2, True))  # include_usage off
        assert [e for e in plain.events() if b'"usage"' in e] == [] and len(plain.events()) == 3


async def test_mid_stream_error_followed_by_done() -> None:
    async with running(ENGINE, fault="mid_stream_error", fault_after_chunks=1) as emu:
        events = (await request(emu.url, "POST", "/v1/chat/completions", chat(5, True))).events()
        assert events[-1] == b"data: [DONE]" and keys(json.loads(events[-2][6:])["error"]) == FLAT


async def test_metrics_names_labels_and_values() -> None:
    async with running(ENGINE, slots=1, tpot_ms=20) as emu:
        tasks = [
            asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(20, True))) for _ in range(2)
        ]
        while emu.stats.active < 1 or emu.stats.waiting < 1:
            await asyncio.sleep(0.01)
        text = (await request(emu.url, path="/metrics")).body.decode()
        assert 'lmdeploy:num_requests_running{model_name="tiny",engine="0"} 1.0' in text
        assert 'lmdeploy:num_requests_waiting{model_name="tiny",engine="0"} 1.0' in text
        assert 'lmdeploy:num_api_requests_waiting{model_name="tiny",engine="0"} 0.0' in text
        assert "# TYPE lmdeploy:gpu_cache_usage_perc gauge" in text
        await asyncio.gather(*tasks)
    async with running(ENGINE, metrics=False) as emu:
        assert (await request(emu.url, path="/metrics")).status == 404


@pytest.mark.parametrize("version", ["0.12.1", "0.13.0"])
async def test_older_releases_answer_health_with_a_bare_200(version: str) -> None:
    async with running(ENGINE, version=version) as emu:
        got = await request(emu.url, path="/health")
        assert (got.status, got.body, got.header("content-length"), got.header("content-type")) == (200, b"", "0", None)
        emu.config.health = "unhealthy"  # no health monitor before 0.14: always 200
        assert (await request(emu.url, path="/health")).body == b""
    emu = Emulator(EmulatorConfig(engine=ENGINE, version=version, load_delay_s=0.4), port=0)
    await emu.start_listening()  # and the port opens only once the model is loaded
    try:
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(emu.host, emu.port)
        await asyncio.wait_for(emu.wait_listening(), 2)
        assert (await request(emu.url, path="/health")).status == 200
    finally:
        await emu.close()


@pytest.mark.parametrize("version", [None, "0.14.0", "0.16.0"])
async def test_newer_releases_report_the_health_state(version: str | None) -> None:
    async with running(ENGINE, version=version, load_delay_s=0.2) as emu:
        got = await request(emu.url, path="/health")
        assert got.status == 503 and got.json()["status"] == "initializing"


async def test_before_0_12_2_a_bad_key_is_fastapis_http_exception_on_keyed_routes_only() -> None:
    async with running(ENGINE, api_key="lm-key", version="0.12.1") as emu:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/is_sleeping")):
            body = chat(2) if method == "POST" else None
            got = await request(emu.url, method, path, body)
            assert (got.status, got.json()) == (401, LEGACY_401), path
            got = await request(emu.url, method, path, body, {"Authorization": "Bearer wrong"})
            assert (got.status, got.json()) == (401, LEGACY_401), path
            assert (await request(emu.url, method, path, body, KEY)).status == 200, path
        assert (await request(emu.url, path="/metrics")).status == 200  # mounted app: no dependency
        assert (await request(emu.url, path="/health")).status == 200
        got = await request(emu.url, "POST", "/v1/embeddings", {"model": "tiny", "input": "x"})
        assert got.status == 400 and got.json()["message"] == "Unsupported by turbomind."  # no key needed


@pytest.mark.parametrize("version", ["0.12.2", "0.15.0"])
async def test_from_0_12_2_the_middleware_answers_error_unauthorized(version: str) -> None:
    async with running(ENGINE, api_key="lm-key", version=version) as emu:
        for path in ("/v1/models", "/metrics", "/is_sleeping"):
            got = await request(emu.url, path=path)
            assert (got.status, got.body) == (401, b'{"error":"Unauthorized"}'), path
            assert (await request(emu.url, path=path, headers=KEY)).status == 200, path
        assert (await request(emu.url, path="/health")).status == 200


@pytest.mark.parametrize("version", [None, "0.16.0"])
async def test_from_0_16_the_401_is_the_flat_protocol_error(version: str | None) -> None:
    async with running(ENGINE, api_key="lm-key", version=version) as emu:
        got = await request(emu.url, path="/v1/models")
        assert got.status == 401 and keys(got.json()) == FLAT and got.json()["type"] == "authentication_error"
