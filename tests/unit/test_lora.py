"""LoRA adapters as models (issue 38 item 5), in process with engines played at the upstream seam: the placement
rules (a replica that holds the adapter first, a load where it is needed, the per-engine limit with the least
recently used idle adapter unloaded to make room, never one with a request in flight), each engine's calls
(vLLM's and SGLang's load API, llama-server's start-up adapters chosen per request), the metrics and the status,
an unknown adapter's 404, and the config's rules. The real engines: tests/e2e/test_lora_vllm.py and
tests/e2e/test_lora_llama.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from llm_gateway.routing.lora_book import Held, has_room, victim
from llm_gateway.settings.loader import ConfigError
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

A, B = "http://engine-a.test", "http://engine-b.test"


def chat_json(model: str = "tiny") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


def config(engine: str = "vllm", urls: tuple[str, ...] = (A, B), max_adapters: int | None = 2, **extra: str) -> str:
    cap = f", max_adapters: {max_adapters}" if max_adapters else ""
    backends = "\n".join(
        f"  - {{name: e{i}, engine: {engine}, url: '{u}', capacity: 4, queue_timeout_s: {extra.get('qt', '5')}{cap}}}"
        for i, u in enumerate(urls)
    )
    deps = ", ".join(
        f"{{backend: e{i}, model: tiny, format: {extra.get('fmt', 'safetensors')}}}" for i in range(len(urls))
    )
    return f"""
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 2}}
backends:
{backends}
models:
  - name: tiny
    deployments: [{deps}]
    adapters:
      - {{name: sql, path: /adapters/sql, aliases: [tiny-sql]}}
      - {{name: poem, path: /adapters/poem}}
      - {{name: code, path: /adapters/code}}
"""


class VLLMs:
    """vLLM's LoRA calls on each engine URL: what it loaded, what it was asked, and each chat's body."""

    def __init__(self, urls: tuple[str, ...] = (A, B), refuse: frozenset[str] = frozenset()) -> None:
        self.loaded: dict[str, list[str]] = {u: [] for u in urls}
        self.events: list[tuple[str, str, str]] = []  # (url, load|unload|chat, adapter or model)
        self.hold: asyncio.Event | None = None  # set: chats wait for it
        self.up = FakeUpstream()
        for u in urls:
            self.up.route("POST", u + "/v1/load_lora_adapter", self._load(u, u in refuse))
            self.up.route("POST", u + "/v1/unload_lora_adapter", self._unload(u))
            self.up.route("POST", u + "/v1/chat/completions", self._chat(u))

    def _load(self, url: str, refuse: bool) -> Any:
        def answer(method: str, u: str, headers: Any, body: bytes | None) -> FakeAnswer:
            name = orjson.loads(body or b"{}")["lora_name"]
            self.events.append((url, "load", name))
            if refuse:
                return FakeAnswer.json({"error": {"message": "no such adapter file", "code": 400}}, 400)
            self.loaded[url].append(name)
            return FakeAnswer.text(f"Success: LoRA adapter '{name}' added successfully.")

        return answer

    def _unload(self, url: str) -> Any:
        def answer(method: str, u: str, headers: Any, body: bytes | None) -> FakeAnswer:
            name = orjson.loads(body or b"{}")["lora_name"]
            self.events.append((url, "unload", name))
            self.loaded[url].remove(name)
            return FakeAnswer.text(f"Success: LoRA adapter '{name}' removed successfully.")

        return answer

    def _chat(self, url: str) -> Any:
        async def answer(method: str, u: str, headers: Any, body: bytes | None) -> FakeAnswer:
            model = orjson.loads(body or b"{}")["model"]
            self.events.append((url, "chat", model))
            if model != "tiny" and model not in self.loaded[url]:
                return FakeAnswer.json({"object": "error", "message": f"The model `{model}` does not exist.",
                                        "type": "NotFoundError", "code": 404}, 404)  # fmt: skip
            if self.hold is not None:
                await self.hold.wait()
            return FakeAnswer.json(chat_json(model))

        return answer

    def count(self, kind: str, url: str | None = None) -> int:
        return sum(1 for u, k, _ in self.events if k == kind and url in (None, u))


async def chat(c: httpx.AsyncClient, model: str) -> httpx.Response:
    return await c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "x"}]})


# -- the rules, pure ----------------------------------------------------------------------------------------


def test_the_victim_is_the_least_recently_used_idle_loaded_adapter() -> None:
    old, new = Held("old", "ready", 0, 1.0), Held("new", "ready", 0, 5.0)
    assert victim([new, old]) is old


def test_an_adapter_with_a_request_in_flight_is_never_the_victim_however_old() -> None:
    busy, idle = Held("busy", "ready", 1, 0.0), Held("idle", "ready", 0, 9.0)
    assert victim([busy, idle]) is idle
    assert victim([busy]) is None


def test_an_adapter_still_loading_or_unloading_is_not_a_victim() -> None:
    assert victim([Held("l", "loading", 0, 0.0), Held("u", "unloading", 0, 0.0)]) is None


def test_room_is_the_limit_and_none_means_no_cap() -> None:
    assert has_room(1, 2) and not has_room(2, 2) and has_room(50, None)


# -- through the gateway -------------------------------------------------------------------------------------


async def test_an_adapter_not_loaded_is_loaded_and_the_next_request_goes_to_the_replica_that_holds_it() -> None:
    eng = VLLMs()
    async with gateway_client(make_config(config()), upstream=eng.up) as (c, _):
        r = await chat(c, "tiny:sql")
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "tiny:sql"
        first = r.headers["x-gateway-backend"]
        for _ in range(4):
            r = await chat(c, "tiny-sql")  # its alias is the same model
            assert r.status_code == 200 and r.headers["x-gateway-backend"] == first
        assert eng.count("load") == 1  # loaded once, on one replica
        assert [m for _, k, m in eng.events if k == "chat"] == ["sql"] * 5  # vLLM is asked for the adapter by name
        r = await chat(c, "tiny")
        assert r.status_code == 200 and eng.events[-1][2] == "tiny"  # the base model is asked for as itself


async def test_the_limit_unloads_the_least_recently_used_idle_adapter_to_make_room() -> None:
    eng = VLLMs((A,))
    async with gateway_client(make_config(config(urls=(A,), max_adapters=2)), upstream=eng.up) as (c, _):
        for model in ("tiny:sql", "tiny:poem", "tiny:sql", "tiny:code"):  # poem is the least recently used then
            assert (await chat(c, model)).status_code == 200
        assert [(k, m) for _, k, m in eng.events if k != "chat"] == [
            ("load", "sql"), ("load", "poem"), ("unload", "poem"), ("load", "code")
        ]  # fmt: skip
        assert sorted(eng.loaded[A]) == ["code", "sql"]
        metrics = (await c.get("/metrics")).text
        assert 'gateway_lora_loads_total{adapter="sql",backend="e0"} 1.0' in metrics
        assert 'gateway_lora_unloads_total{adapter="poem",backend="e0",reason="evicted"} 1.0' in metrics
        assert 'gateway_lora_resident{adapter="code",backend="e0"} 1.0' in metrics
        assert 'gateway_lora_resident{adapter="poem"' not in metrics
        ready = (await c.get("/readyz")).json()["backends"]["e0"]["lora"]
        assert ready == {"limit": 2, "adapters": {n: {"state": "ready", "in_flight": 0} for n in ("code", "sql")}}


async def test_an_adapter_with_a_request_in_flight_is_not_unloaded_the_newcomer_waits_for_it() -> None:
    eng = VLLMs((A,))
    async with gateway_client(make_config(config(urls=(A,), max_adapters=1)), upstream=eng.up) as (c, _):
        assert (await chat(c, "tiny:sql")).status_code == 200
        eng.hold = asyncio.Event()
        slow = asyncio.create_task(chat(c, "tiny:sql"))  # in flight on sql
        await asyncio.sleep(0.1)
        other = asyncio.create_task(chat(c, "tiny:poem"))  # needs sql's place
        await asyncio.sleep(0.3)
        assert eng.count("unload") == 0 and not other.done()  # sql is busy: never unloaded under a request
        eng.hold.set()
        assert (await slow).status_code == 200
        r = await other
        assert r.status_code == 200, r.text
        assert [(k, m) for _, k, m in eng.events if k != "chat"] == [
            ("load", "sql"),
            ("unload", "sql"),
            ("load", "poem"),
        ]


async def test_with_every_adapter_busy_past_the_queue_timeout_the_request_gets_429() -> None:
    eng = VLLMs((A,))
    cfg = make_config(config(urls=(A,), max_adapters=1, qt="0.5"))
    async with gateway_client(cfg, upstream=eng.up) as (c, _):
        eng.hold = asyncio.Event()
        slow = asyncio.create_task(chat(c, "tiny:sql"))
        await asyncio.sleep(0.1)
        r = await chat(c, "tiny:poem")
        assert r.status_code == 429 and r.headers["x-gateway-reject-reason"] == "queue_timeout", r.text
        eng.hold.set()
        assert (await slow).status_code == 200


async def test_concurrent_requests_for_one_adapter_load_it_once() -> None:
    eng = VLLMs((A,))
    async with gateway_client(make_config(config(urls=(A,))), upstream=eng.up) as (c, _):
        rs = await asyncio.gather(*(chat(c, "tiny:sql") for _ in range(4)))
        assert [r.status_code for r in rs] == [200] * 4
        assert eng.count("load") == 1


async def test_a_replica_that_cannot_load_the_adapter_is_passed_over_for_one_that_can() -> None:
    eng = VLLMs(refuse=frozenset({A}))
    async with gateway_client(make_config(config()), upstream=eng.up) as (c, _):
        for _ in range(3):
            r = await chat(c, "tiny:sql")
            assert r.status_code == 200, r.text
            assert r.headers["x-gateway-backend"] == "e1"
        metrics = (await c.get("/metrics")).text
        assert 'gateway_lora_loads_total{adapter="sql",backend="e1"} 1.0' in metrics


async def test_an_engine_that_lost_the_adapter_has_it_loaded_again() -> None:
    eng = VLLMs((A,))
    async with gateway_client(make_config(config(urls=(A,))), upstream=eng.up) as (c, _):
        assert (await chat(c, "tiny:sql")).status_code == 200
        eng.loaded[A].clear()  # the engine restarted
        assert (await chat(c, "tiny:sql")).status_code != 200  # its 404 (no other replica to retry on)
        assert (await chat(c, "tiny:sql")).status_code == 200
        assert eng.count("load") == 2


async def test_an_unknown_adapter_is_404_model_not_found_in_openais_envelope() -> None:
    async with gateway_client(make_config(config()), upstream=VLLMs().up) as (c, _):
        r = await chat(c, "tiny:nope")
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error"
        models = {m["id"] for m in (await c.get("/v1/models")).json()["data"]}
        assert {"tiny", "tiny:sql", "tiny-sql", "tiny:poem", "tiny:code"} <= models


async def test_llama_server_is_asked_for_its_start_up_adapter_by_id_in_the_body() -> None:
    listing = [
        {"id": 0, "path": "/adapters/poem.gguf", "scale": 0.0},
        {"id": 1, "path": "/adapters/sql.gguf", "scale": 0.0},
    ]
    up = FakeUpstream(
        {
            ("GET", A + "/lora-adapters"): FakeAnswer.json(listing),
            ("POST", A + "/v1/chat/completions"): FakeAnswer.json(chat_json()),
        }
    )
    text = config("llama-server", (A,), None, fmt="gguf").replace("/adapters/sql", "/elsewhere/sql.gguf")
    async with gateway_client(make_config(text), upstream=up) as (c, _):
        assert (await chat(c, "tiny:sql")).status_code == 200  # found by its file's name
        assert (await chat(c, "tiny:sql")).status_code == 200
        assert (await chat(c, "tiny")).status_code == 200
        bodies = [call.json() for call in up.calls_to(A + "/v1/chat/completions")]
        # the model itself: an id no adapter has at scale 0 (each adapter at 0; unnamed, llama-server applies them)
        assert [b.get("lora") for b in bodies] == [[{"id": 1, "scale": 1.0}]] * 2 + [[{"id": -1, "scale": 0.0}]]
        assert len(up.calls_to(A + "/lora-adapters")) == 1  # looked up once
        r = await chat(c, "tiny:code")  # not started with it
        assert r.status_code == 502 and r.json()["error"]["code"] == "adapter_load_failed"
        assert "--lora /adapters/code" in r.json()["error"]["message"]


async def test_sglang_loads_through_its_api_and_is_asked_in_lora_path() -> None:
    up = FakeUpstream(
        {
            ("POST", A + "/load_lora_adapter"): FakeAnswer.json({"success": True, "error_message": ""}),
            ("POST", A + "/v1/chat/completions"): FakeAnswer.json(chat_json()),
        }
    )
    async with gateway_client(make_config(config("sglang", (A,))), upstream=up) as (c, _):
        assert (await chat(c, "tiny:sql")).status_code == 200
        assert up.calls_to(A + "/load_lora_adapter")[0].json() == {"lora_name": "sql", "lora_path": "/adapters/sql"}
        body = up.calls_to(A + "/v1/chat/completions")[0].json()
        assert body["lora_path"] == "sql" and body["model"] == "tiny"


# -- config ---------------------------------------------------------------------------------------------------


def test_adapters_need_an_engine_that_serves_them() -> None:
    with pytest.raises(ConfigError, match="serves LoRA adapters"):
        make_config(config("ollama", (A,), None, fmt="gguf"))


def test_an_adapters_public_name_may_not_clash_with_another_model() -> None:
    text = config() + "  - {name: tiny-sql, deployments: [{backend: e0, model: x, format: safetensors}]}\n"
    with pytest.raises(ConfigError, match="duplicate model name or alias: 'tiny-sql'"):
        make_config(text)
