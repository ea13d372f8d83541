"""llama-server emulator against the captures of a real llama-server (captures/llamacpp/http).

Layouts are compared with ``shape``; the values an adapter reads (error ``type``/``code``, statuses,
finish reasons, usage numbers, ``n_ctx``) with ``pick`` against the same capture."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from emu_helpers import capture, capture_text, chat, keys, pick, request, running, shape, usage_adds_up

from llm_gateway_emulators import expected_text

pytestmark = pytest.mark.asyncio
ENGINE = "llama-server"
KEY = {"Authorization": "Bearer sk-test"}


def head_names(r: object) -> list[str]:
    return [k for k, _ in r.headers]  # type: ignore[attr-defined]


CHAT_VALUES = ("object", "system_fingerprint", "choices.0.index", "choices.0.finish_reason", "choices.0.message.role")
NUMBERS = re.compile(r"\d+")


def comments(metrics: bytes) -> list[str]:
    """The # HELP / # TYPE lines of a Prometheus text body: names, types and order."""
    return [ln for ln in metrics.decode().splitlines() if ln.startswith("#")]


async def test_health_and_models_match_capture() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, path="/health")
        cap = capture("llamacpp/http/01_health.txt")
        assert (got.status, got.body, head_names(got)) == (cap.status, cap.body, head_names(cap))
        assert got.headers == cap.headers  # Server, empty ACAO, Content-Type, Content-Length, Keep-Alive
        got = await request(emu.url, path="/v1/models")
        cap = capture("llamacpp/http/02_v1_models.txt")
        assert shape(got.json()) == shape(cap.json())
        assert got.json()["data"][0]["id"] == "tiny-llama" and got.json()["data"][0]["owned_by"] == "llamacpp"


async def test_single_model_cards_have_no_router_status() -> None:
    # the adapter tells a router (status.value on each card, 61/62 captures) from a single-model server by it
    unloaded = capture("llamacpp/http/61_router_models_unloaded.txt").json()["data"]
    loaded = capture("llamacpp/http/62_router_models_loaded.txt").json()["data"]
    assert [(m["id"], m["status"]["value"]) for m in unloaded] == [("res-x", "unloaded"), ("res-y", "unloaded")]
    assert [(m["id"], m["status"]["value"]) for m in loaded] == [("res-x", "loaded"), ("res-y", "unloaded")]
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, path="/v1/models")
    assert got.json()["data"] and all("status" not in m for m in got.json()["data"])
    assert all("status" not in m for m in capture("llamacpp/http/02_v1_models.txt").json()["data"])


async def test_chat_nonstream_matches_capture_layout() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(16, model="whatever"))
        cap = capture("llamacpp/http/05_chat_nonstream.txt")
        assert head_names(got) == head_names(cap)
        assert shape(got.json()) == shape(cap.json())
        body = got.json()
        assert body["model"] == "tiny-llama"  # the request's model is not validated nor echoed
        assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len("chatcmpl-") + 32
        assert body["choices"][0]["message"]["content"] == expected_text(16)
        assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"
        want = (*CHAT_VALUES, "usage.completion_tokens", "usage.prompt_tokens_details.cached_tokens")
        assert pick(body, *want) == pick(cap.json(), *want)  # request as captured: max_tokens 16
        assert usage_adds_up(body["usage"]) and usage_adds_up(cap.json()["usage"])


async def test_chat_stream_with_usage_matches_capture() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        req = chat(6, stream=True, stream_options={"include_usage": True})
        got = await request(emu.url, "POST", "/v1/chat/completions", req)
        cap = capture("llamacpp/http/06_chat_stream.txt")
        assert head_names(got) == head_names(cap) and got.header("content-type") == "text/event-stream"
        g, c = got.data(), cap.data()
        assert len(g) == len(c) and g[-1] == c[-1] == "[DONE]"
        assert [shape(x) for x in g[:-1]] == [shape(x) for x in c[:-1]]
        assert "timings" not in g[-3] and "timings" in g[-2] and g[-2]["choices"] == []
        fin = ("object", "choices.0.finish_reason", "choices.0.delta")
        assert pick(g[-3], *fin) == pick(c[-3], *fin) and c[-3]["choices"][0]["finish_reason"] == "length"
        assert pick(g[-2], "choices", "usage.completion_tokens") == pick(c[-2], "choices", "usage.completion_tokens")
        assert pick(g[0], "choices.0.delta") == pick(c[0], "choices.0.delta")  # role chunk: content null
        assert "".join(x["choices"][0]["delta"].get("content") or "" for x in g[1:-3]) == expected_text(6)


async def test_chat_stream_without_usage_puts_timings_on_finish_chunk() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(3, stream=True))
        cap = capture("llamacpp/http/07_chat_stream_no_usage.txt")
        assert [shape(x) for x in got.data()[:-1]] == [shape(x) for x in cap.data()[:-1]]
        assert got.body.endswith(b"data: [DONE]\n\n")
        fin = ("choices.0.finish_reason", "choices.0.delta")
        assert pick(got.data()[-2], *fin) == pick(cap.data()[-2], *fin)
        assert cap.data()[-2]["choices"][0]["finish_reason"] == "length" and "usage" not in got.data()[-2]


async def test_completions_match_capture() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 12})
        cap = capture("llamacpp/http/08_completions.txt")
        assert shape(got.json()) == shape(cap.json())
        want = ("object", "choices.0.finish_reason", "choices.0.logprobs", "usage.completion_tokens")
        assert pick(got.json(), *want) == pick(cap.json(), *want)
        assert usage_adds_up(got.json()["usage"])
        req = {"prompt": "Once", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
        got = await request(emu.url, "POST", "/v1/completions", req)
        cap = capture("llamacpp/http/09_completions_stream.txt")
        assert [shape(x) for x in got.data()[:-1]] == [shape(x) for x in cap.data()[:-1]]
        last = ("object", "choices.0.text", "choices.0.finish_reason", "usage.completion_tokens")
        assert pick(got.data()[-2], *last) == pick(cap.data()[-2], *last)  # usage rides the finish chunk


async def test_stop_string_ends_with_stop() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(16, stop=[" test"]))
        body = got.json()
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["choices"][0]["message"]["content"] == "Hello, this is a"
        assert body["usage"]["completion_tokens"] == 6  # the token that matched counts
        cap = capture("llamacpp/http/10_chat_stop_string.txt").json()
        assert shape(body) == shape(cap)
        assert (
            pick(body, "choices.0.finish_reason")
            == pick(cap, "choices.0.finish_reason")
            == {"choices.0.finish_reason": "stop"}
        )


async def test_embeddings_need_flag_and_support_base64() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/embeddings", {"input": "hello world"})
        cap = capture("llamacpp/http/12_embeddings_on_chat_server.txt")
        assert (got.status, got.body) == (cap.status, cap.body) and got.header("Connection") == "close"
    async with running(ENGINE, embeddings=True, api_key="sk-test") as emu:
        emb = ("object", "data.0.object", "data.0.index", "data.1.index")
        got = await request(emu.url, "POST", "/v1/embeddings", {"input": "hello world"}, KEY)
        cap = capture("llamacpp/http/44_emb_single.txt")
        assert shape(got.json()) == shape(cap.json()) and pick(got.json(), *emb) == pick(cap.json(), *emb)
        got = await request(emu.url, "POST", "/v1/embeddings", {"input": "hi", "encoding_format": "base64"}, KEY)
        cap = capture("llamacpp/http/46_emb_base64.txt")
        assert shape(got.json()) == shape(cap.json()) and pick(got.json(), *emb) == pick(cap.json(), *emb)
        batch = {"model": "tiny-embed", "input": ["hello", "world wide"], "encoding_format": "float"}
        got = await request(emu.url, "POST", "/v1/embeddings", batch, KEY)
        cap = capture("llamacpp/http/45_emb_batch.txt")
        assert (got.status, head_names(got)) == (cap.status, head_names(cap))
        assert shape(got.json()) == shape(cap.json()) and pick(got.json(), *emb) == pick(cap.json(), *emb)
        for body in (got.json(), cap.json()):  # one vector per input, in order; prompt tokens are all the tokens
            assert [d["index"] for d in body["data"]] == [0, 1]
            assert len({len(d["embedding"]) for d in body["data"]}) == 1
            assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"]


@pytest.mark.parametrize(
    ("rel", "raw"),
    [
        ("llamacpp/http/13_err_bad_json.txt", b'{"model":"tiny-llama","messages":[{"role":"user",'),
        ("llamacpp/http/16_err_messages_wrong_type.txt", b'{"model":"tiny-llama","messages":"hi","max_tokens":4}'),
        ("llamacpp/http/17_err_missing_messages.txt", b'{"model":"tiny-llama","max_tokens":4}'),
    ],
)
async def test_chat_body_errors_match_capture(rel: str, raw: bytes) -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", raw_body=raw)
        cap = capture(rel)
        assert got.status == cap.status == 400
        assert head_names(got) == head_names(cap) and got.header("Connection") == "close"
        assert keys(got.json()["error"]) == keys(cap.json()["error"]) == ["code", "message", "type"]
        assert pick(got.json(), "error.type", "error.code") == pick(cap.json(), "error.type", "error.code")
        if not rel.endswith("13_err_bad_json.txt"):
            assert got.body == cap.body


async def test_legacy_build_answers_500_server_error_for_chat_parse_errors() -> None:
    async with running(ENGINE, llama_legacy=True) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", raw_body=b'{"messages":[')
        assert got.status == 500 and got.json()["error"]["type"] == "server_error"
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2, n=2))
        assert got.status == 500 and "Only one completion choice" in got.json()["error"]["message"]


async def test_unknown_route_and_get_on_post_are_404() -> None:
    async with running(ENGINE) as emu:
        for method, path, rel in (
            ("GET", "/v1/nope", "llamacpp/http/20_err_404.txt"),
            ("GET", "/v1/chat/completions", "llamacpp/http/21_err_get_on_post.txt"),
        ):
            got = await request(emu.url, method, path)
            cap = capture(rel)
            assert (got.status, got.body, got.headers[2:]) == (cap.status, cap.body, cap.headers[2:])


@pytest.mark.parametrize(
    ("rel", "stream"),
    [("llamacpp/http/18_err_prompt_too_long.txt", False), ("llamacpp/http/19_err_prompt_too_long_stream.txt", True)],
)
async def test_prompt_too_long_is_exceed_context_size_error(rel: str, stream: bool) -> None:
    async with running(ENGINE, ctx_len=2048) as emu:  # the captured server ran with -c 2048
        req = chat(4, stream=stream, messages=[{"role": "user", "content": "the " * 9000}])
        got = await request(emu.url, "POST", "/v1/chat/completions", req)
        cap = capture(rel)
        assert (got.status, head_names(got)) == (cap.status, head_names(cap)) == (400, head_names(cap))
        assert shape(got.json()) == shape(cap.json())
        want = ("error.type", "error.code", "error.n_ctx")
        assert (
            pick(got.json(), *want)
            == pick(cap.json(), *want)
            == {
                "error.type": "exceed_context_size_error",  # what LlamaServerAdapter keys context_length_exceeded on
                "error.code": 400,
                "error.n_ctx": 2048,
            }
        )
        for err in (got.json()["error"], cap.json()["error"]):
            assert err["n_prompt_tokens"] > err["n_ctx"]
            assert str(err["n_prompt_tokens"]) in err["message"] and str(err["n_ctx"]) in err["message"]
        assert NUMBERS.sub("N", got.json()["error"]["message"]) == NUMBERS.sub("N", cap.json()["error"]["message"])


async def test_auth_bodies_paths_and_headers() -> None:
    async with running(ENGINE, api_key="sk-test", embeddings=True, model="tiny-embed") as emu:
        got, cap = await request(emu.url, path="/health"), capture("llamacpp/http/40_emb_health_no_key.txt")
        assert (got.status, got.body, got.headers) == (cap.status, cap.body, cap.headers)  # /health needs no key
        got = await request(emu.url, path="/v1/models")  # protected in the captured build
        cap = capture("llamacpp/http/41_emb_models_no_key.txt")
        assert (got.status, got.body, got.headers) == (cap.status, cap.body, cap.headers)
        got = await request(emu.url, "POST", "/v1/embeddings", {"input": "x"})
        cap = capture("llamacpp/http/42_emb_no_key.txt")
        assert (got.status, got.body, got.headers) == (cap.status, cap.body, cap.headers)
        bad = await request(emu.url, "POST", "/v1/embeddings", {"input": "x"}, {"Authorization": "Bearer nope"})
        assert bad.body == capture("llamacpp/http/43_emb_wrong_key.txt").body
        assert (
            await request(emu.url, "POST", "/v1/embeddings", {"input": "x"}, {"X-Api-Key": "sk-test"})
        ).status == 200
        for path in ("/metrics", "/slots", "/props"):
            assert (await request(emu.url, path=path)).status == 401
            assert (await request(emu.url, path=path, headers=KEY)).status == 200
        got, cap = (
            await request(emu.url, path="/metrics", headers=KEY),
            capture("llamacpp/http/48_emb_metrics_with_key.txt"),
        )
        assert (got.status, head_names(got), comments(got.body)) == (cap.status, head_names(cap), comments(cap.body))
        # an --embeddings server still chats (the model is the served one, whatever the request says)
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(4, model="tiny-embed"), KEY)
        cap = capture("llamacpp/http/47_chat_on_embedding_server.txt")
        want = (*CHAT_VALUES, "model", "usage.completion_tokens")
        assert got.status == cap.status == 200 and pick(got.json(), *want) == pick(cap.json(), *want)


async def test_metrics_names_types_and_header() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, path="/metrics")
        cap = capture("llamacpp/http/26_metrics_busy.txt")
        assert head_names(got) == head_names(cap) and got.header("Content-Type") == "text/plain; version=0.0.4"
        assert int(got.header("Process-Start-Time-Unix") or 0) > 0
        assert comments(got.body) == comments(cap.body)
        assert "llamacpp:requests_processing 0\n" in got.body.decode()
    async with running(ENGINE, metrics=False) as emu:
        got = await request(emu.url, path="/metrics")
        assert got.status == 501 and got.json()["error"]["type"] == "not_supported_error"


async def test_slots_props_and_busy_state() -> None:
    async with running(ENGINE, slots=2, tpot_ms=20) as emu:
        idle = await request(emu.url, path="/slots")
        assert idle.body == capture("llamacpp/http/04_slots_idle.txt").body.replace(b"2048", b"4096")
        props = await request(emu.url, path="/props")
        assert keys(props.json()) == keys(capture("llamacpp/http/03_props.txt").json())
        assert props.json()["total_slots"] == 2
        streams = [
            asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(40, True))) for _ in range(3)
        ]
        while emu.stats.active < 2 or emu.stats.waiting < 1:
            await asyncio.sleep(0.01)
        busy = (await request(emu.url, path="/slots")).json()
        assert [s["is_processing"] for s in busy] == [True, True]
        cap_busy = capture("llamacpp/http/25_slots_busy.txt").json()[0]
        assert keys(busy[0]) == keys(cap_busy)
        assert (await request(emu.url, path="/slots?fail_on_no_slot=1")).status == 503
        health, cap = await request(emu.url, path="/health"), capture("llamacpp/http/27_health_busy.txt")
        assert (health.status, health.body, head_names(health)) == (cap.status, cap.body, head_names(cap))  # busy=ok
        text = (await request(emu.url, path="/metrics")).body.decode()
        assert "llamacpp:requests_processing 2\n" in text and "llamacpp:requests_deferred 1\n" in text
        await asyncio.gather(*streams)
        assert (await request(emu.url, path="/slots?fail_on_no_slot=1")).status == 200
        after, cap = await request(emu.url, path="/metrics"), capture("llamacpp/http/29_metrics_after.txt")
        assert comments(after.body) == comments(cap.body)
        for line in ("llamacpp:requests_processing 0", "llamacpp:requests_deferred 0"):  # idle again
            assert line in after.body.decode().splitlines() and line in cap.body.decode().splitlines()


async def test_loading_state() -> None:
    async with running(ENGINE, load_delay_s=0.3) as emu:
        got = await request(emu.url, path="/health")
        assert got.status == 503
        assert got.body == b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
        assert (await request(emu.url, "POST", "/v1/chat/completions", chat(2))).status == 503
        models = await request(emu.url, path="/v1/models")
        assert models.status == 200 and models.json()["data"][0]["meta"] is None
        await asyncio.sleep(0.35)
        assert (await request(emu.url, path="/health")).status == 200


async def test_mid_stream_error_has_no_done_and_first_error_is_plain_http() -> None:
    async with running(ENGINE, fault="mid_stream_error", fault_after_chunks=2) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(8, True))
        data = got.data()
        assert got.status == 200 and data[-1]["error"]["type"] == "server_error" and "[DONE]" not in data
        assert len([d for d in data if "choices" in d and d["choices"][0]["delta"].get("content")]) == 2
        emu.config.merge({"fault": "mid_stream_error", "fault_after_chunks": 0})
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(8, True))
        assert got.status == 500 and got.json()["error"]["code"] == 500


async def test_keep_alive_counts_down_and_headers_wait_for_first_token() -> None:
    async with running(ENGINE, ttft_ms=150) as emu:
        reader, writer = await asyncio.open_connection(emu.host, emu.port)
        req = f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{emu.port}\r\n\r\n".encode()
        writer.write(req + req)
        data = b""
        while data.count(b"HTTP/1.1 200") < 2:
            data += await reader.read(4096)
        assert b"Keep-Alive: timeout=5, max=100" in data and b"Keep-Alive: timeout=5, max=99" in data
        writer.close()
        t0 = asyncio.get_running_loop().time()
        task = asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(1, True)))
        got = await task
        assert asyncio.get_running_loop().time() - t0 >= 0.14 and got.status == 200


async def test_legacy_build_leaves_model_listings_open() -> None:
    async with running(ENGINE, api_key="sk-test", llama_legacy=True) as emu:
        for path in ("/v1/models", "/models", "/api/tags", "/health"):
            assert (await request(emu.url, path=path)).status == 200, path
        assert (await request(emu.url, path="/props")).status == 401


@pytest.mark.parametrize(
    ("rel", "body"),
    [
        ("llamacpp/http/14_err_unknown_field.txt", chat(4, model="tiny-llama", temperature=0, frobnicate=True)),
        ("llamacpp/http/15_err_unknown_model.txt", chat(4, model="no-such-model", temperature=0)),
        ("llamacpp/http/11_chat_n2_seed.txt", chat(8, model="tiny-llama", temperature=1.0, seed=42, n=2)),
        ("llamacpp/http/30_chat_256_tokens.txt", chat(256, messages=[{"role": "user", "content": "Write a story."}])),
    ],
)
async def test_what_llama_server_accepts_answers_like_the_capture(rel: str, body: dict[str, object]) -> None:
    """Unknown fields are ignored, the model is never checked (the served one is echoed), n=2 gives two
    choices (usage counting one), 256 tokens end on length: statuses, models, finish reasons and usage
    numbers as captured."""
    async with running(ENGINE, model="tiny-llama") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", body)
        cap = capture(rel)
        assert (got.status, head_names(got)) == (cap.status, head_names(cap)) == (200, head_names(cap))
        g, c = got.json(), cap.json()
        assert shape(g) == shape(c)
        want = (
            "model",
            "usage.completion_tokens",
            *(f"choices.{i}.{k}" for i in (0, 1) for k in ("index", "finish_reason")),
        )
        assert pick(g, *want) == pick(c, *want)
        assert usage_adds_up(g["usage"]) and usage_adds_up(c["usage"])


async def test_max_tokens_over_the_context_is_cut_at_n_ctx() -> None:
    # the captured body is abridged (`<"after " x 1948>` stands for the repeated text), so its values are
    # read from the text: finish_reason and usage
    text = capture_text("llamacpp/http/24_max_tokens_over_ctx.txt")
    cap_finish = re.findall(r'"finish_reason":"(\w+)"', text)
    cap_usage = json.loads(re.search(r'"usage":(\{"completion_tokens"[^{}]*\{[^{}]*\}\})', text)[1])
    async with running(ENGINE, model="tiny-llama", ctx_len=2048) as emu:  # captured with -c 2048
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(100000, temperature=0))
        assert got.status == 200 and text.splitlines()[1] == "HTTP/1.1 200 OK"
        assert [c["finish_reason"] for c in got.json()["choices"]] == cap_finish == ["length"]
        for usage in (got.json()["usage"], cap_usage):  # prompt + generated fill the context exactly
            assert usage["total_tokens"] == 2048 and usage_adds_up(usage)


async def test_tokenize_layout() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/tokenize", {"content": "hello world"})
        cap = capture("llamacpp/http/22_tokenize.txt")
        assert (got.status, head_names(got), shape(got.json())) == (cap.status, head_names(cap), shape(cap.json()))
        assert all(isinstance(t, int) for t in got.json()["tokens"])


async def test_client_disconnect_frees_the_slot_as_captured() -> None:
    notes = capture_text("llamacpp/http/50_client_disconnect.txt")  # the real server, 0.3 s after the client left
    assert "llamacpp:requests_processing 0" in notes and "'is_processing': False" in notes
    async with running(ENGINE, slots=1, tpot_ms=5) as emu:
        with pytest.raises(asyncio.TimeoutError):
            await request(emu.url, "POST", "/v1/chat/completions", chat(16000, True), timeout=0.2)
        for _ in range(200):
            if emu.stats.active == 0:
                break
            await asyncio.sleep(0.01)
        slots = (await request(emu.url, path="/slots")).json()
        assert [s["is_processing"] for s in slots] == [False]
        text = (await request(emu.url, path="/metrics")).body.decode().splitlines()
        assert "llamacpp:requests_processing 0" in text and "llamacpp:requests_deferred 0" in text
