"""Ollama emulator: native API and /v1 layer against the captures (captures/ollama, build 0.5.4)
and the HEAD behaviour documented in the reference (the default)."""

from __future__ import annotations

import asyncio
import re

import pytest
from emu_helpers import capture, capture_text, keys, pick, request, running, shape, usage_adds_up

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
        for path, rel in (
            ("/", "ollama/root.txt"),
            ("/api/ps", "ollama/api-ps-empty.txt"),
            ("/v1/nope", "ollama/err-404-path.txt"),
            ("/metrics", "ollama/metrics.txt"),  # no Prometheus endpoint: Go's plain-text 404
        ):
            got, cap = await request(emu.url, path=path), capture(rel)
            assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap)), path
        for path, rel in (("/api/tags", "ollama/api-tags.txt"), ("/api/version", "ollama/api-version.txt")):
            got, cap = await request(emu.url, path=path), capture(rel)
            assert names(got) == names(cap) and shape(got.json()) == shape(cap.json())
        got = await request(emu.url, path="/v1/models")
        assert got.body.endswith(b"\n") and shape(got.json()) == shape(capture("ollama/v1-models.txt").json())
        assert got.json()["data"][0]["id"] == "tiny:latest"
        show, cap = await request(emu.url, "POST", "/api/show", {"model": "tiny"}), capture("ollama/api-show.txt")
        assert set(keys(cap.json())) <= set(keys(show.json()))  # HEAD adds "capabilities"
        assert keys(show.json()["details"]) == keys(cap.json()["details"])
        details = ("details.format", "details.family", "details.families", "details.parameter_size")
        assert pick(show.json(), *details) == pick(cap.json(), *details)
        assert set(keys(show.json()["model_info"])) <= set(keys(cap.json()["model_info"]))
        assert (await request(emu.url, "POST", "/api/show", {"model": "nope"})).status == 404
        got, cap = await request(emu.url, path="/v1/models/tiny"), capture("ollama/v1-models-tiny.txt")
        assert names(got) == names(cap) and keys(got.json()) == keys(cap.json())
        assert got.body == cap.body.replace(b"%d" % cap.json()["created"], b"%d" % got.json()["created"])


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
        done = ("done", "done_reason", "eval_count", "message.role", "message.content")
        assert pick(final, *done) == pick(c[-1], *done)  # num_predict 5 as captured; the final line has no text
        assert "".join(x["message"]["content"] for x in g) == expected_text(5)


async def test_native_nonstream_chat_and_generate_match_capture() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(12, stream=False))
        cap = capture("ollama/api-chat-nonstream.txt")
        assert names(got) == names(cap) and shape(got.json()) == shape(cap.json())
        done = ("done", "done_reason", "eval_count", "message.role")
        assert pick(got.json(), *done) == pick(cap.json(), *done)  # num_predict 12 as captured
        gen = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 5}}
        got = await request(emu.url, "POST", "/api/generate", gen)
        cap = capture("ollama/api-generate-nonstream.txt")
        assert (
            keys(got.json())[:5] == keys(cap.json())[:5] == ["model", "created_at", "response", "done", "done_reason"]
        )
        assert set(keys(cap.json())) <= set(keys(got.json()))
        assert pick(got.json(), "done", "done_reason", "eval_count") == pick(
            cap.json(), "done", "done_reason", "eval_count"
        )


async def test_native_stop_unload_and_errors() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(16, options={"stop": [" test"]}))
        cap = capture("ollama/api-chat-stream-stop.txt")
        assert names(got) == names(cap)
        final = ("done", "done_reason", "message.role", "message.content")
        assert (
            pick(got.ndjson()[-1], *final)
            == pick(cap.ndjson()[-1], *final)
            == {
                "done": True,
                "done_reason": "stop",
                "message.role": "assistant",
                "message.content": "",  # the final line carries no text
            }
        )
        assert all(x["done"] is False for x in got.ndjson()[:-1]) and all(x["done"] is False for x in cap.ndjson()[:-1])
        got = await request(emu.url, "POST", "/api/generate", {"model": "tiny", "keep_alive": 0})
        cap = capture("ollama/api-generate-unload.txt")
        assert shape(got.json()) == shape(cap.json())
        assert pick(got.json(), "response", "done", "done_reason") == pick(
            cap.json(), "response", "done", "done_reason"
        )
        for body, rel in (
            (b'{"model":"tiny","messages":[', "ollama/err-api-chat-bad-json.txt"),
            (b'{"messages":[]}', "ollama/err-api-chat-missing-model.txt"),
            (b'{"model":"nope","messages":[]}', "ollama/err-api-chat-bad-model.txt"),
        ):
            got, cap = await request(emu.url, "POST", "/api/chat", raw_body=body), capture(rel)
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
        want = ("object", "system_fingerprint", "choices.0.index", "choices.0.message.role", "choices.0.finish_reason")
        assert pick(body, *want) == pick(cap.json(), *want)
        assert usage_adds_up(body["usage"]) and usage_adds_up(cap.json()["usage"])


async def test_v1_ignores_a_bearer_token() -> None:
    async with running(ENGINE) as emu:  # Ollama has no keys: a client's Authorization header changes nothing
        req = {"model": "tiny", "messages": MSG, "max_tokens": 2}
        got = await request(emu.url, "POST", "/v1/chat/completions", req, {"Authorization": "Bearer sk-anything"})
        cap = capture("ollama/v1-chat-with-bearer.txt")
        assert (got.status, names(got), shape(got.json())) == (cap.status, names(cap), shape(cap.json()))
        want = ("object", "choices.0.finish_reason", "usage.completion_tokens")
        assert pick(got.json(), *want) == pick(cap.json(), *want)  # 2 tokens, length


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


@pytest.mark.parametrize(
    ("rel", "usage"), [("ollama/v1-chat-stream-usage.txt", True), ("ollama/v1-chat-stream-nousage.txt", False)]
)
async def test_v1_stream_legacy_matches_capture(rel: str, usage: bool) -> None:
    async with running(ENGINE, ollama_legacy=True) as emu:
        req = {"model": "tiny", "messages": MSG, "max_tokens": 5, "stream": True}
        if usage:
            req["stream_options"] = {"include_usage": True}
        got, cap = await request(emu.url, "POST", "/v1/chat/completions", req), capture(rel)
        assert names(got) == names(cap)
        assert [shape(x) for x in got.data()] == [shape(x) for x in cap.data()]
        per_chunk = ("choices.0.finish_reason", "usage.completion_tokens")
        assert [pick(x, *per_chunk) for x in got.data()] == [pick(x, *per_chunk) for x in cap.data()]
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
    """OLLAMA_NUM_PARALLEL=1, OLLAMA_MAX_QUEUE=1: one running, one queued, the rest refused at once
    (503), natively and on /v1; the admitted ones finish normally."""
    log = capture_text("ollama/queue-full/serve-log.txt")  # the captured server's environment
    env = dict(re.findall(r"(OLLAMA_NUM_PARALLEL|OLLAMA_MAX_QUEUE):(\d+)", log))
    assert env == {"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_MAX_QUEUE": "1"}
    slots, max_queue = int(env["OLLAMA_NUM_PARALLEL"]), int(env["OLLAMA_MAX_QUEUE"])
    async with running(ENGINE, slots=slots, max_queue=max_queue, tpot_ms=20) as emu:
        tasks = [
            asyncio.ensure_future(request(emu.url, "POST", "/api/chat", native(20, stream=False))) for _ in range(2)
        ]
        while emu.stats.active < 1 or emu.stats.waiting < 1:
            await asyncio.sleep(0.01)
        got = await request(emu.url, "POST", "/api/chat", native(2, stream=False))
        cap = capture("ollama/queue-full/api-req2.txt")
        assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap)) == (503, BUSY, names(cap))
        for rel in ("ollama/queue-full/v1-req2.txt", "ollama/queue-full/v1-req5.txt", "ollama/queue-full/v1-req6.txt"):
            got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "tiny", "messages": MSG})
            cap = capture(rel)
            assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap)), rel
            assert pick(got.json(), "error.type", "error.code") == {"error.type": "api_error", "error.code": None}
        done = await asyncio.gather(*tasks)
        assert [r.status for r in done] == [200, 200]
        assert emu.stats.rejected == 4
        cap = capture("ollama/queue-full/api-req3.txt")  # the queued one, once it ran
        final = ("model", "done", "done_reason", "message.role")
        assert pick(done[1].json(), *final) == pick(cap.json(), *final)
        assert (done[1].json()["eval_count"], cap.json()["eval_count"]) == (20, 100)  # each its num_predict
        emu.config.tpot_ms = 0
        for rel in ("ollama/queue-full/v1-req1.txt", "ollama/queue-full/v1-req3.txt", "ollama/queue-full/v1-req4.txt"):
            req = {"model": "tiny", "messages": MSG, "max_tokens": 100}  # the admitted /v1 requests, as captured
            got, cap = await request(emu.url, "POST", "/v1/chat/completions", req), capture(rel)
            assert (got.status, names(got), shape(got.json())) == (cap.status, names(cap), shape(cap.json()))
            want = ("object", "choices.0.finish_reason", "usage.completion_tokens")
            assert pick(got.json(), *want) == pick(cap.json(), *want), rel


async def test_repeat_abort_matches_quirk_captures() -> None:
    """Ollama 0.5.4 aborts a generation that repeats a token: a 200 whose stream just stops (no done line,
    no [DONE]), a non-streamed body with done false and no done_reason, a /v1 body with zero usage."""
    async with running(ENGINE, fault="ollama_repeat_abort", fault_after_chunks=3) as emu:
        got = await request(emu.url, "POST", "/api/chat", native(20))
        lines = got.ndjson()
        assert len(lines) == 3 and all(x["done"] is False for x in lines) and got.status == 200
        for rel in ("ollama/quirk-api-chat-stream-token-repeat-abort.txt", "ollama/api-chat-stream-200.txt"):
            cap = capture(rel)
            assert (cap.status, names(cap)) == (got.status, names(got))
            assert {str(shape(x)) for x in cap.ndjson()} == {str(shape(x)) for x in lines}, rel
            assert all(x["done"] is False and "done_reason" not in x for x in cap.ndjson()), rel
        got = await request(emu.url, "POST", "/api/chat", native(20, stream=False))
        for rel in ("ollama/quirk-api-chat-nonstream-token-repeat-abort.txt", "ollama/queue-full/api-req1.txt"):
            cap = capture(rel)
            assert (got.status, shape(got.json())) == (cap.status, shape(cap.json())), rel
            assert (
                pick(got.json(), "done", "done_reason")
                == pick(cap.json(), "done", "done_reason")
                == {
                    "done": False,
                    "done_reason": "<missing>",
                }
            )
        v1 = {"model": "tiny", "messages": MSG, "max_tokens": 20}
        got = await request(emu.url, "POST", "/v1/chat/completions", v1)
        cap = capture("ollama/quirk-v1-chat-nonstream-token-repeat-abort.txt")
        assert shape(got.json()) == shape(cap.json()) and got.json()["usage"]["total_tokens"] == 0
        want = ("choices.0.finish_reason", "usage.prompt_tokens", "usage.completion_tokens", "usage.total_tokens")
        assert pick(got.json(), *want) == pick(cap.json(), *want)
        got = await request(emu.url, "POST", "/v1/chat/completions", {**v1, "stream": True})
        assert "[DONE]" not in got.data() and all(d["choices"][0]["finish_reason"] is None for d in got.data())
    async with running(ENGINE, fault="ollama_repeat_abort", fault_after_chunks=3, ollama_legacy=True) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", {**v1, "stream": True})  # as 0.5.4 streams
        cap = capture("ollama/quirk-v1-chat-stream-token-repeat-abort.txt")
        assert "[DONE]" not in cap.data() and all(d["choices"][0]["finish_reason"] is None for d in cap.data())
        assert (got.status, names(got)) == (cap.status, names(cap)) and "[DONE]" not in got.data()
        assert {str(shape(x)) for x in got.data()} == {str(shape(x)) for x in cap.data()}


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


async def test_every_emulated_route_is_in_the_real_route_table() -> None:
    """Ollama's gin router logs its table at startup (``[GIN-debug] POST /api/chat --> ...``); each route
    the emulator answers must be one the captured server had, with that method."""
    log = capture_text("ollama/serve-log-first.txt")
    real = set(re.findall(r"\[GIN-debug\] (GET|POST|HEAD|DELETE) +(\S+) +-->", log))
    assert ("POST", "/api/chat") in real and ("GET", "/v1/models/:model") in real
    async with running(ENGINE) as emu:
        served = {(method, path) for path, table in emu.engine._routes.items() for method in table}
        served.add(("GET", "/v1/models/:model"))  # answered by prefix in the emulator
        assert (await request(emu.url, path="/v1/models/tiny")).status == 200
    assert served <= real, sorted(served - real)
