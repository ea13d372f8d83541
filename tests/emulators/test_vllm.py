"""vLLM emulator against the captures of a real vLLM 0.32.0 API server (captures/vllm).

Layouts are compared with ``shape``; the values an adapter reads (error ``type``/``param``/``code``,
statuses, finish and stop reasons, usage numbers, metric lines) with ``pick`` or as lines."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from emu_helpers import capture, capture_text, keys, pick, request, running, shape, usage_adds_up
from emu_helpers import chat as base_chat

from llm_gateway_emulators import Emulator, EmulatorConfig, expected_text

pytestmark = pytest.mark.asyncio
ENGINE = "vllm"


def chat(max_tokens: int | None = 4, stream: bool = False, **extra: object) -> dict[str, object]:
    return base_chat(max_tokens, stream, **{"model": "tiny-llama", **extra})


def names(r: object) -> list[str]:
    return [k for k, _ in r.headers]  # type: ignore[attr-defined]


CHOICE = ("object", "choices.0.index", "choices.0.finish_reason", "choices.0.stop_reason", "choices.0.logprobs")
NUMBERS = re.compile(r"\d+")
GOOD = {"Authorization": "Bearer sk-good"}


def metric_lines(text: str, *prefixes: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefixes)]


async def test_info_routes_match_capture() -> None:
    async with running(ENGINE, model="tiny-llama", ctx_len=512) as emu:
        for path, rel in (
            ("/health", "vllm/health.txt"),
            ("/ping", "vllm/ping.txt"),
            ("/version", "vllm/version.txt"),
            ("/load", "vllm/load.txt"),
        ):
            got, cap = await request(emu.url, path=path), capture(rel)
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
        want = (*CHOICE, "choices.0.message.role", "choices.0.message.reasoning", "usage.completion_tokens")
        assert pick(got.json(), *want) == pick(cap.json(), *want)  # 16 tokens, finish length, stop_reason null
        assert pick(got.json(), "usage.prompt_tokens_details") == pick(cap.json(), "usage.prompt_tokens_details")
        assert usage_adds_up(got.json()["usage"]) and usage_adds_up(cap.json()["usage"])


async def test_stop_reason_carries_the_stop_string() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        got = (await request(emu.url, "POST", "/v1/chat/completions", chat(16, stop=[" test"]))).json()
        assert (got["choices"][0]["finish_reason"], got["choices"][0]["stop_reason"]) == ("stop", " test")
        cap = capture("vllm/chat-stop.txt").json()  # captured with stop ["e"]: stop_reason is the matched string
        assert shape(got) == shape(cap) and pick(got, "object", "choices.0.finish_reason") == pick(
            cap, "object", "choices.0.finish_reason"
        )
        assert (
            isinstance(cap["choices"][0]["stop_reason"], str)
            and cap["choices"][0]["stop_reason"] not in (cap["choices"][0]["message"]["content"])
        )


@pytest.mark.parametrize(
    ("rel", "n", "options"),
    [
        ("vllm/chat-stream-nousage.txt", 4, None),
        ("vllm/chat-stream-usage.txt", 8, {"include_usage": True}),
        ("vllm/chat-stream-continuous-usage.txt", 4, {"include_usage": True, "continuous_usage_stats": True}),
    ],
)
async def test_chat_stream_matches_capture(rel: str, n: int, options: dict[str, bool] | None) -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        extra = {"stream_options": options} if options else {}
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(n, True, **extra))
        cap = capture(rel)
        assert names(got) == names(cap)
        g, c = got.data(), cap.data()
        assert [shape(x) for x in g] == [shape(x) for x in c]
        assert got.body.endswith(b"data: [DONE]\n\n")
        per_chunk = ("choices.0.finish_reason", "choices.0.delta.role", "usage.completion_tokens")
        assert [pick(x, *per_chunk) for x in g[:-1]] == [pick(x, *per_chunk) for x in c[:-1]]


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
        cap = capture("vllm/completions-nonstream.txt")
        assert shape(got.json()) == shape(cap.json())
        assert pick(got.json(), *CHOICE, "usage.completion_tokens") == pick(
            cap.json(), *CHOICE, "usage.completion_tokens"
        )


@pytest.mark.parametrize(
    ("rel", "body"),
    [
        ("vllm/err-bad-model.txt", chat(4, model="nope")),
        ("vllm/err-bad-model-stream.txt", chat(4, True, model="nope")),
        ("vllm/err-bad-temperature.txt", chat(4, temperature=-1)),
        ("vllm/err-max-tokens-too-big.txt", chat(100000)),
        ("vllm/chat-n2-logprobs.txt", chat(4, n=2, temperature=0)),
    ],
)
async def test_errors_match_capture_bytes(rel: str, body: dict[str, object]) -> None:
    async with running(ENGINE, model="tiny-llama", ctx_len=512) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", body)
        cap = capture(rel)
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
        assert (await request(emu.url, path="/v1/nope")).body == capture("vllm/err-404-path.txt").body


async def test_prompt_too_long_matches_capture_values() -> None:
    async with running(ENGINE, model="tiny-llama", ctx_len=512) as emu:  # captured with --max-model-len 512
        long = chat(4, messages=[{"role": "user", "content": "x" * 4000}])
        got = await request(emu.url, "POST", "/v1/chat/completions", long)
        cap = capture("vllm/err-prompt-too-long.txt")
        assert (got.status, names(got)) == (cap.status, names(cap)) == (400, names(cap))
        assert shape(got.json()) == shape(cap.json())
        want = ("error.type", "error.param", "error.code")
        assert (
            pick(got.json(), *want)
            == pick(cap.json(), *want)
            == {
                "error.type": "BadRequestError",
                "error.param": "input_tokens",  # what VLLMAdapter keys context_length_exceeded on
                "error.code": 400,
            }
        )
        g, c = got.json()["error"]["message"], cap.json()["error"]["message"]
        assert NUMBERS.sub("N", g) == NUMBERS.sub("N", c) and "maximum context length is 512 tokens" in g


@pytest.mark.parametrize(
    ("method", "path", "headers", "rel"),
    [
        ("GET", "/v1/models", {}, "vllm/auth/models-noauth.txt"),
        ("GET", "/v1/models", {"Authorization": "Bearer wrong"}, "vllm/auth/models-wrongkey.txt"),
        ("GET", "/v1/models", {"X-Api-Key": "sk-good"}, "vllm/auth/models-xapikey.txt"),  # Bearer only
        ("POST", "/v1/chat/completions", {}, "vllm/auth/chat-noauth.txt"),
        ("GET", "/health", {}, "vllm/auth/health-noauth.txt"),  # only /v1 is protected
        ("GET", "/version", {}, "vllm/auth/version-noauth.txt"),
    ],
)
async def test_auth_answers_match_capture_bytes(method: str, path: str, headers: dict[str, str], rel: str) -> None:
    async with running(ENGINE, model="tiny-llama", api_key="sk-good") as emu:
        body = chat(12) if method == "POST" else None
        got, cap = await request(emu.url, method, path, body, headers), capture(rel)
        assert (got.status, got.body, names(got)) == (cap.status, cap.body, names(cap))  # 401s: no vary header


async def test_auth_only_on_v1_bearer_only() -> None:
    async with running(ENGINE, model="tiny-llama", api_key="sk-good", ctx_len=512) as emu:
        got, cap = await request(emu.url, path="/v1/models", headers=GOOD), capture("vllm/auth/models-goodkey.txt")
        assert (got.status, names(got), shape(got.json())) == (cap.status, names(cap), shape(cap.json()))
        card = ("data.0.id", "data.0.object", "data.0.owned_by", "data.0.max_model_len")
        assert pick(got.json(), "object", *card) == pick(cap.json(), "object", *card)
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(12), GOOD)
        cap = capture("vllm/auth/chat-goodkey.txt")
        assert (got.status, names(got), shape(got.json())) == (cap.status, names(cap), shape(cap.json()))
        assert pick(got.json(), *CHOICE, "usage.completion_tokens") == pick(
            cap.json(), *CHOICE, "usage.completion_tokens"
        )
        req = chat(6, True, stream_options={"include_usage": True})
        got, cap = (
            await request(emu.url, "POST", "/v1/chat/completions", req, GOOD),
            capture("vllm/auth/chat-stream-goodkey.txt"),
        )
        assert (got.status, names(got)) == (cap.status, names(cap))
        g, c = got.data(), cap.data()  # the captured detokenizer merged two tokens into one chunk ("KL do")
        assert [shape(x) for x in (g[0], *g[-3:])] == [shape(x) for x in (c[0], *c[-3:])]
        assert {str(shape(x)) for x in g[1:-3]} == {str(shape(x)) for x in c[1:-3]}
        per_chunk = ("choices.0.delta.role", "choices.0.finish_reason", "usage.completion_tokens")
        assert [pick(x, *per_chunk) for x in (g[0], *g[-3:-1])] == [pick(x, *per_chunk) for x in (c[0], *c[-3:-1])]
        got, cap = await request(emu.url, path="/metrics"), capture("vllm/auth/metrics-noauth-head.txt")
        assert (got.status, names(got), got.header("content-type")) == (
            cap.status,
            names(cap),
            cap.header("content-type"),
        )
        for path in ("/health", "/metrics", "/version", "/ping", "/load"):
            assert (await request(emu.url, path=path)).status == 200, path


async def test_tokenize_layout_and_values() -> None:
    async with running(ENGINE, model="tiny-llama", ctx_len=512) as emu:
        got = await request(emu.url, "POST", "/tokenize", {"model": "tiny-llama", "prompt": "hello"})
        cap = capture("vllm/tokenize.txt")
        assert (got.status, names(got), shape(got.json())) == (cap.status, names(cap), shape(cap.json()))
        assert pick(got.json(), "max_model_len", "token_strs") == pick(cap.json(), "max_model_len", "token_strs")
        for body in (got.json(), cap.json()):
            assert body["count"] == len(body["tokens"])


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


LOAD = ("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:request_success_total{")


async def test_metrics_idle_and_after_match_capture_lines() -> None:
    async with running(ENGINE, model="tiny-llama") as emu:
        idle, cap = await request(emu.url, path="/metrics"), capture("vllm/metrics-idle.txt")
        assert (idle.status, names(idle), idle.header("content-type")) == (
            cap.status,
            names(cap),
            cap.header("content-type"),
        )
        assert metric_lines(idle.body.decode(), *LOAD) == metric_lines(cap.body.decode(), *LOAD)
        # as captured after: five requests ended on length, one on a stop string
        for _ in range(5):
            await request(emu.url, "POST", "/v1/chat/completions", chat(3))
        await request(emu.url, "POST", "/v1/chat/completions", chat(16, stop=[" test"]))
        after, cap = await request(emu.url, path="/metrics"), capture("vllm/metrics-after.txt")
        assert metric_lines(after.body.decode(), *LOAD) == metric_lines(cap.body.decode(), *LOAD)
        under_load = capture_text("vllm/metrics-under-load.txt")  # the body alone: its metric families
        for text in (cap.body.decode(), under_load):
            families = set(metric_lines(text, "# TYPE vllm:"))
            assert set(metric_lines(after.body.decode(), "# TYPE vllm:")) <= families
        assert 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 12.0' in under_load.splitlines()


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


@pytest.mark.parametrize(
    "rel",
    [
        "vllm/serve-log-default.txt",
        "vllm/serve-log-eager-apikey.txt",
        "vllm/serve-log-eager-no-triton.txt",
        "vllm/serve-log-headdim16-crash.txt",
    ],
)
async def test_every_emulated_route_is_in_the_real_route_table(rel: str) -> None:
    """vLLM logs its route table at startup (``Route: /path, Methods: ...``); each route the emulator
    answers must be one the captured server had, with that method, and the served options must be the
    ones the emulator tests use (max_model_len 512, model tiny-llama)."""
    log = capture_text(rel)
    real = {
        (m.group(1), meth.strip())
        for m in re.finditer(r"Route: (\S+), Methods: (.+)", log)
        for meth in m.group(2).split(",")
    }
    args = re.search(r"non-default args: (\{.*\})", log)
    assert args is not None and "'max_model_len': 512" in args[1] and "'served_model_name': ['tiny-llama']" in args[1]
    async with running(ENGINE, model="tiny-llama") as emu:
        routes = emu.engine._routes  # test-only peek at the emulator's table
        served = {(path, method) for path, table in routes.items() for method in table}
    # /v1/embeddings exists only on a server started for an embedding model (this one was not)
    assert served - {("/v1/embeddings", "POST")} <= real
