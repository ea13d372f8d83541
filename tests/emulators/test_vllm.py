"""vLLM emulator against the captures of a real vLLM 0.32.0 API server (captures/vllm)."""

from __future__ import annotations

import asyncio
import json

import pytest
from emu_helpers import capture, keys, request, running, shape
from emu_helpers import chat as base_chat

from llm_gateway_emulators import Emulator, EmulatorConfig, expected_text

pytestmark = pytest.mark.asyncio
ENGINE = "vllm"


def chat(max_tokens: int | None = 4, stream: bool = False, **extra: object) -> dict[str, object]:
    return base_chat(max_tokens, stream, **{"model": "tiny-llama", **extra})


def names(r: object) -> list[str]:
    return [k for k, _ in r.headers]  # type: ignore[attr-defined]


async def test_info_routes_match_capture() -> None:
    async with running(ENGINE, model="tiny-llama", ctx_len=512) as emu:
        for path, rel in (
            ("/health", "health.txt"),
            ("/ping", "ping.txt"),
            ("/version", "version.txt"),
            ("/load", "load.txt"),
        ):
            got, cap = await request(emu.url, path=path), capture(f"vllm/{rel}")
            assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap)), path
        got, cap = await request(emu.url, path="/v1/models"), capture("vllm/models.txt")
        assert shape(got.json()) == shape(cap.json())
        card = got.json()["data"][0]
        assert (card["id"], card["owned_by"], card["max_model_len"]) == ("tiny-llama", "vllm", 512)


async def test_chat_nonstream_matches_capture() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(16, model="tiny-llama"))
        cap = capture("vllm/chat-nonstream.txt")
        assert names(got) == names(cap) and shape(got.json()) == shape(cap.json())
        assert got.json()["choices"][0]["message"]["content"] == expected_text(16)
        assert got.json()["system_fingerprint"].startswith("vllm-0.32.0-")


async def test_stop_reason_carries_the_stop_string() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = (await request(emu.url, "POST", "/v1/chat/completions", chat(16, stop=[" test"]))).json()
        assert (got["choices"][0]["finish_reason"], got["choices"][0]["stop_reason"]) == ("stop", " test")
        assert shape(got) == shape(capture("vllm/chat-stop.txt").json())


@pytest.mark.parametrize(
    ("rel", "n", "options"),
    [
        ("chat-stream-nousage.txt", 4, None),
        ("chat-stream-usage.txt", 8, {"include_usage": True}),
        ("chat-stream-continuous-usage.txt", 4, {"include_usage": True, "continuous_usage_stats": True}),
    ],
)
async def test_chat_stream_matches_capture(rel: str, n: int, options: dict[str, bool] | None) -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        extra = {"stream_options": options} if options else {}
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(n, True, **extra))
        cap = capture(f"vllm/{rel}")
        assert names(got) == names(cap)
        g, c = got.data(), cap.data()
        assert [shape(x) for x in g] == [shape(x) for x in c]
        assert got.body.endswith(b"data: [DONE]\n\n")


async def test_include_usage_defaults_to_true_once_stream_options_is_present() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(3, True, stream_options={}))
        usage = got.data()[-2]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
        off = await request(
            emu.url, "POST", "/v1/chat/completions", chat(3, True, stream_options={"include_usage": False})
        )
        assert all("usage" not in d for d in off.data()[:-1])


async def test_completions_nonstream_matches_capture() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 4})
        assert shape(got.json()) == shape(capture("vllm/completions-nonstream.txt").json())


@pytest.mark.parametrize(
    ("rel", "body"),
    [
        ("err-bad-model.txt", chat(4, model="nope")),
        ("err-bad-model-stream.txt", chat(4, True, model="nope")),
        ("err-bad-temperature.txt", chat(4, temperature=-1)),
        ("err-max-tokens-too-big.txt", chat(100000)),
        ("chat-n2-logprobs.txt", chat(4, n=2, temperature=0)),
    ],
)
async def test_errors_match_capture_bytes(rel: str, body: dict[str, object]) -> None:
    async with running(ENGINE, model="tiny-llama", ctx_len=512) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", body)
        cap = capture(f"vllm/{rel}")
        assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap))


async def test_validation_errors_are_400_bad_request() -> None:
    async with running(ENGINE, model="tiny-llama", ctx_len=512) as emu:
        bad = b'{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}] "max_tokens":4}'
        got = await request(emu.url, "POST", "/v1/chat/completions", raw_body=bad)
        cap = capture("vllm/err-bad-json.txt")
        assert got.status == 400 and shape(got.json()) == shape(cap.json())
        assert got.json()["error"]["type"] == "Bad Request" and "json_invalid" in got.json()["error"]["message"]
        got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "tiny-llama", "max_tokens": 4})
        assert got.body == capture("vllm/err-missing-messages.txt").body
        long = chat(4, messages=[{"role": "user", "content": "x" * 4000}])
        got = await request(emu.url, "POST", "/v1/chat/completions", long)
        assert got.status == 400 and got.json()["error"]["param"] == "input_tokens"
        assert (await request(emu.url, path="/v1/nope")).body == capture("vllm/err-404-path.txt").body


async def test_auth_only_on_v1_bearer_only() -> None:
    async with running(ENGINE, model="tiny-llama", api_key="sk-good") as emu:
        got = await request(emu.url, path="/v1/models")
        cap = capture("vllm/auth/models-noauth.txt")
        assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap))  # no vary header
        assert (await request(emu.url, path="/v1/models", headers={"X-Api-Key": "sk-good"})).status == 401
        assert (await request(emu.url, path="/v1/models", headers={"Authorization": "Bearer bad"})).status == 401
        assert (await request(emu.url, path="/v1/models", headers={"Authorization": "Bearer sk-good"})).status == 200
        for path in ("/health", "/metrics", "/version", "/ping", "/load"):
            assert (await request(emu.url, path=path)).status == 200, path


async def test_port_refuses_connections_while_loading() -> None:
    emu = Emulator(EmulatorConfig(engine=ENGINE, load_delay_s=0.4), port=0)
    await emu.start_listening()
    try:
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(emu.host, emu.port)
        await asyncio.wait_for(emu.wait_listening(), 2)
        assert (await request(emu.url, path="/health")).status == 200
    finally:
        await emu.close()


async def test_dead_engine_health_503_and_500_body() -> None:
    async with running(ENGINE, model="tiny-llama", health="unhealthy") as emu:
        assert (await request(emu.url, path="/health")).status == 503
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2))
        cap = capture("vllm/err-engine-dead-500.txt")
        assert got.status == 500 and got.json() == json.loads(cap.body.split(b"\n")[0])


async def test_mid_stream_error_is_followed_by_done() -> None:
    async with running(ENGINE, model="tiny-llama", fault="mid_stream_error", fault_after_chunks=1) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(5, True))
        events = got.events()
        assert events[-1] == b"data: [DONE]" and events[-2].startswith(b'data: {"error": {"message": ')
        assert json.loads(events[-2][6:])["error"]["type"] == "InternalServerError"


async def test_metrics_names_labels_and_live_values() -> None:
    async with running(ENGINE, model="tiny-llama", slots=1, tpot_ms=20) as emu:
        cap = capture("vllm/metrics-under-load-max-num-seqs-2.txt").body.decode()
        streams = [
            asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(30, True))) for _ in range(3)
        ]
        while emu.stats.active < 1 or emu.stats.waiting < 2:
            await asyncio.sleep(0.01)
        got = await request(emu.url, path="/metrics")
        text = got.body.decode()
        assert got.header("content-type") == "text/plain; version=1.0.0; charset=utf-8"
        assert 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 1.0' in text
        assert 'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2.0' in text
        for line in text.splitlines():
            if line.startswith("# TYPE vllm:"):
                assert line in cap, line
        emu.config.report_waiting = 7
        text = (await request(emu.url, path="/metrics")).body.decode()
        assert 'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 7.0' in text
        await asyncio.gather(*streams)
        text = (await request(emu.url, path="/metrics")).body.decode()
        assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-llama"} 3.0' in text
        assert keys(json.loads((await request(emu.url, path="/load")).body)) == ["server_load"]
