"""Ollama emulator: native API and /v1 layer against the captures (captures/ollama, build 0.5.4)
and the HEAD behaviour documented in the reference (the default)."""

from __future__ import annotations

import asyncio

import pytest
from emu_helpers import capture, keys, request, running, shape

from llm_gateway_emulators import expected_text

pytestmark = pytest.mark.asyncio
ENGINE = "ollama"
MSG = [{"role": "user", "content": "hi"}]
BUSY = b'{"error":"server busy, please try again.  maximum pending requests exceeded"}'


def names(r: object) -> list[str]:
    return [k for k, _ in r.headers]  # type: ignore[attr-defined]


def native(num_predict: int = 5, stream: bool = True, **extra: object) -> dict[str, object]:
    return {"model": "tiny", "messages": MSG, "stream": stream, "options": {"num_predict": num_predict}, **extra}


async def test_status_routes_match_capture() -> None:
    async with running(ENGINE) as emu:
        for path, rel in (("/", "root.txt"), ("/api/ps", "api-ps-empty.txt"), ("/v1/nope", "err-404-path.txt")):
            got, cap = await request(emu.url, path=path), capture(f"ollama/{rel}")
            assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap)), path
        for path, rel in (("/api/tags", "api-tags.txt"), ("/api/version", "api-version.txt")):
            got, cap = await request(emu.url, path=path), capture(f"ollama/{rel}")
            assert names(got) == names(cap) and shape(got.json()) == shape(cap.json())
        got = await request(emu.url, path="/v1/models")
        assert got.body.endswith(b"\n") and shape(got.json()) == shape(capture("ollama/v1-models.txt").json())
        assert got.json()["data"][0]["id"] == "tiny:latest"
        show = await request(emu.url, "POST", "/api/show", {"model": "tiny"})
        assert set(keys(show.json())) >= {"modelfile", "parameters", "template", "details", "model_info"}
        assert (await request(emu.url, "POST", "/api/show", {"model": "nope"})).status == 404
        got = await request(emu.url, path="/v1/models/tiny")
        assert got.body == b'{"id":"tiny","object":"model","created":%d,"owned_by":"library"}\n' % got.json()["created"]


async def test_native_chat_stream_matches_capture() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(5))
        cap = capture("ollama/api-chat-stream.txt")
        assert names(got) == names(cap) and got.header("Content-Type") == "application/x-ndjson"
        g, c = got.ndjson(), cap.ndjson()
        assert [shape(x) for x in g[:-1]] == [shape(x) for x in c[:-1]]
        final = g[-1]
        assert keys(final) == [
            "model",
            "created_at",
            "message",
            "done_reason",
            "done",
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        ]
        assert set(keys(c[-1])) <= set(keys(final))
        assert final["done"] is True and final["done_reason"] == "length" and final["eval_count"] == 5
        assert "".join(x["message"]["content"] for x in g) == expected_text(5)


async def test_native_nonstream_chat_and_generate_match_capture() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(12, stream=False))
        cap = capture("ollama/api-chat-nonstream.txt")
        assert names(got) == names(cap) and shape(got.json()) == shape(cap.json())
        gen = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 5}}
        got = await request(emu.url, "POST", "/api/generate", gen)
        cap = capture("ollama/api-generate-nonstream.txt")
        assert (
            keys(got.json())[:5] == keys(cap.json())[:5] == ["model", "created_at", "response", "done", "done_reason"]
        )
        assert set(keys(cap.json())) <= set(keys(got.json()))


async def test_native_stop_unload_and_errors() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(16, options={"stop": [" test"]}))
        assert got.ndjson()[-1]["done_reason"] == "stop"
        got = await request(emu.url, "POST", "/api/generate", {"model": "tiny", "keep_alive": 0})
        assert shape(got.json()) == shape(capture("ollama/api-generate-unload.txt").json())
        for body, rel in (
            (b'{"model":"tiny","messages":[', "err-api-chat-bad-json.txt"),
            (b'{"messages":[]}', "err-api-chat-missing-model.txt"),
            (b'{"model":"nope","messages":[]}', "err-api-chat-bad-model.txt"),
        ):
            got, cap = await request(emu.url, "POST", "/api/chat", raw_body=body), capture(f"ollama/{rel}")
            assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap)), rel


async def test_cold_load_duration_and_ps() -> None:
    async with running(ENGINE, load_delay_s=0.2) as emu:
        assert (await request(emu.url, path="/api/ps")).json() == {"models": []}
        first = (await request(emu.url, "POST", "/api/chat", native(2, stream=False))).json()
        second = (await request(emu.url, "POST", "/api/chat", native(2, stream=False))).json()
        assert first["load_duration"] >= 200_000_000 > second["load_duration"]
        ps = (await request(emu.url, path="/api/ps")).json()
        assert ps["models"][0]["name"] == "tiny:latest"
        assert set(keys(capture("ollama/api-ps-loaded.txt").json()["models"][0])) <= set(keys(ps["models"][0]))


async def test_v1_chat_nonstream_matches_capture() -> None:
    async with running(ENGINE) as emu:
        got = await request(
            emu.url, "POST", "/v1/chat/completions", {"model": "tiny", "messages": MSG, "max_tokens": 12}
        )
        cap = capture("ollama/v1-chat-nonstream.txt")
        assert names(got) == names(cap) and shape(got.json()) == shape(cap.json())
        body = got.json()
        assert got.body.endswith(b"}\n") and body["system_fingerprint"] == "fp_ollama"
        assert body["id"].startswith("chatcmpl-") and 0 <= int(body["id"].split("-")[1]) < 999


async def test_v1_stream_head_layout() -> None:
    async with running(ENGINE) as emu:
        req = {
            "model": "tiny",
            "messages": MSG,
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        data = (await request(emu.url, "POST", "/v1/chat/completions", req)).data()
        assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": "Hello"}
        assert [d["choices"][0]["delta"] for d in data[1:3]] == [{"content": ","}, {"content": " this"}]
        assert data[3]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
        assert data[4]["choices"] == [] and data[4]["usage"]["completion_tokens"] == 3 and data[5] == "[DONE]"


@pytest.mark.parametrize(("rel", "usage"), [("v1-chat-stream-usage.txt", True), ("v1-chat-stream-nousage.txt", False)])
async def test_v1_stream_legacy_matches_capture(rel: str, usage: bool) -> None:
    async with running(ENGINE, ollama_legacy=True) as emu:
        req = {"model": "tiny", "messages": MSG, "max_tokens": 5, "stream": True}
        if usage:
            req["stream_options"] = {"include_usage": True}
        got, cap = await request(emu.url, "POST", "/v1/chat/completions", req), capture(f"ollama/{rel}")
        assert names(got) == names(cap)
        assert [shape(x) for x in got.data()] == [shape(x) for x in cap.data()]
        assert [d["choices"][0]["delta"].get("role") for d in got.data()[:5]] == ["assistant"] * 5


async def test_v1_errors_and_ignored_fields() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", raw_body=b'{"model":"tiny","messages":[')
        cap = capture("ollama/err-v1-bad-json.txt")
        assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap))
        got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "tiny", "messages": []})
        assert got.body == capture("ollama/err-v1-missing-messages.txt").body
        got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "nope", "messages": MSG})
        assert got.status == 404 and got.json()["error"]["type"] == "not_found_error"
        req = {"model": "tiny", "messages": MSG, "max_completion_tokens": 2}
        body = (await request(emu.url, "POST", "/v1/chat/completions", req)).json()
        assert body["usage"]["completion_tokens"] == emu.config.natural_stop_tokens  # ignored, as Ollama does
        eff = emu.stats.last_effective or {}
        assert (eff["temperature"], eff["top_p"]) == (1.0, 1.0)
    async with running(ENGINE, ollama_legacy=True) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "nope", "messages": MSG})
        cap = capture("ollama/err-v1-bad-model.txt")
        assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap))


async def test_host_guard_403_empty_body() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, path="/api/version", headers={"Host": "evil.example.com"})
        assert got.status == 403 and got.body == b"" and got.header("Content-Length") == "0"
        for host in ("localhost:11434", "10.1.2.3", "ollama.internal", "box.local", f"127.0.0.1:{emu.port}", "[::1]:1"):
            assert (await request(emu.url, path="/api/version", headers={"Host": host})).status == 200, host


async def test_queue_full_matches_capture() -> None:
    async with running(ENGINE, slots=1, max_queue=1, tpot_ms=20) as emu:
        tasks = [
            asyncio.ensure_future(request(emu.url, "POST", "/api/chat", native(20, stream=False))) for _ in range(2)
        ]
        while emu.stats.active < 1 or emu.stats.waiting < 1:
            await asyncio.sleep(0.01)
        got = await request(emu.url, "POST", "/api/chat", native(2, stream=False))
        cap = capture("ollama/queue-full/api-req2.txt")
        assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap)) == (503, BUSY, names(cap))
        got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "tiny", "messages": MSG})
        assert (got.status, got.body) == (503, capture("ollama/queue-full/v1-req2.txt").body)
        assert [r.status for r in await asyncio.gather(*tasks)] == [200, 200]
        assert emu.stats.rejected == 2


async def test_repeat_abort_matches_quirk_captures() -> None:
    async with running(ENGINE, fault="ollama_repeat_abort", fault_after_chunks=3) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(20))
        lines = got.ndjson()
        assert len(lines) == 3 and all(x["done"] is False for x in lines) and got.status == 200
        got = await request(emu.url, "POST", "/api/chat", native(20, stream=False))
        assert shape(got.json()) == shape(capture("ollama/quirk-api-chat-nonstream-token-repeat-abort.txt").json())
        v1 = {"model": "tiny", "messages": MSG, "max_tokens": 20}
        got = await request(emu.url, "POST", "/v1/chat/completions", v1)
        cap = capture("ollama/quirk-v1-chat-nonstream-token-repeat-abort.txt")
        assert shape(got.json()) == shape(cap.json()) and got.json()["usage"]["total_tokens"] == 0
        got = await request(emu.url, "POST", "/v1/chat/completions", {**v1, "stream": True})
        assert "[DONE]" not in got.data() and all(d["choices"][0]["finish_reason"] is None for d in got.data())


async def test_mid_stream_error_native_line_and_v1_silent_end() -> None:
    async with running(ENGINE, fault="mid_stream_error", fault_after_chunks=2) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(10))
        lines = got.ndjson()
        assert got.status == 200 and len(lines) == 3 and set(lines[-1]) == {"error"}
        got = await request(
            emu.url,
            "POST",
            "/v1/chat/completions",
            {"model": "tiny", "messages": MSG, "max_tokens": 10, "stream": True},
        )
        assert got.status == 200 and len(got.data()) == 2 and "[DONE]" not in got.data()


async def test_embeddings_native_and_v1() -> None:
    async with running(ENGINE) as emu:
        got = (await request(emu.url, "POST", "/api/embed", {"model": "tiny", "input": ["a", "b"]})).json()
        assert keys(got) == ["model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"]
        assert len(got["embeddings"]) == 2 and len(got["embeddings"][0]) == 64
        got = (await request(emu.url, "POST", "/v1/embeddings", {"model": "tiny", "input": "a"})).json()
        assert keys(got) == ["object", "data", "model", "usage"]
