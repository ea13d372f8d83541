"""The Batch API in-process (the gateway over ASGI, engines played by a FakeUpstream, the embedded SQLite database
in tmp_path): files uploaded as the openai SDK sends them, owned by their key; batches whose every line runs
through the service (the batch priority class, a concurrency bound, retries of passing refusals), with output and
error files in OpenAI's shape and custom_ids kept; bad input files, cancel, expiry and paging."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from llm_gateway.http.asgi import GatewayApp
from tests.conftest import OTHER_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

CONFIG = """
server: {access_log: false, data_dir: "DATA"}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
    - {name: bob, sha256: "${BOB_SHA}"}
batches: {concurrency: 3, retry_after_s: 0.05, poll_s: 0.05, max_file_bytes: 4096, lease_s: 5}
backends:
  - {name: v, engine: vllm, url: "http://engine.test", timeouts: {first_byte_s: 30, total_s: 60}}
models:
  - name: m
    deployments: [{backend: v, model: up, format: safetensors, engine_priority: true,
                   capabilities: [chat, completions, embeddings]}]
"""
CHAT = "http://engine.test/v1/chat/completions"
OTHER = {"authorization": f"Bearer {OTHER_KEY}"}


def answer(text: str = "hi") -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion",
        "model": "up",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def jsonl(n: int, url: str = "/v1/chat/completions", **extra: Any) -> bytes:
    lines = []
    for i in range(n):
        body = {"model": "m", "messages": [{"role": "user", "content": f"line {i}"}], **extra}
        lines.append(orjson.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}))
    return b"\n".join(lines) + b"\n"


def first_fast(then_s: float) -> Callable[..., FakeAnswer]:
    """An engine that answers its first request at once and each later one after `then_s`."""
    seen = []

    def engine(method: str, url: str, headers: Any, body: bytes | None) -> FakeAnswer:
        seen.append(body)
        delay = 0.0 if len(seen) == 1 else then_s
        return FakeAnswer(200, {"content-type": "application/json"}, [orjson.dumps(answer())], delay_s=delay)

    return engine


@pytest.fixture
def gateway(tmp_path: Path) -> Callable[..., Any]:
    """An in-process gateway over `upstream`; the batch runner and its database are closed at the end."""

    def make(upstream: FakeUpstream, text: str = CONFIG) -> Any:
        cfg = make_config(text.replace("DATA", str(tmp_path / "data")))

        async def run() -> AsyncIterator[tuple[httpx.AsyncClient, GatewayApp]]:
            async with gateway_client(cfg, upstream=upstream) as (client, app):
                try:
                    yield client, app
                finally:
                    batches = app.context.batches
                    if batches is not None:
                        await batches.runner.aclose()
                        if batches._store is not None:
                            await batches._store.db.aclose()

        from contextlib import asynccontextmanager

        return asynccontextmanager(run)()

    return make


async def upload(client: httpx.AsyncClient, data: bytes, **kw: Any) -> httpx.Response:
    return await client.post("/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}, **kw)


async def create_batch(client: httpx.AsyncClient, data: bytes, window: str = "24h") -> dict[str, Any]:
    f = await upload(client, data)
    assert f.status_code == 200, f.text
    r = await client.post(
        "/v1/batches",
        json={"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": window},
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


async def until_status(client: httpx.AsyncClient, batch_id: str, *wanted: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        b = (await client.get(f"/v1/batches/{batch_id}")).json()
        if b["status"] in wanted or time.monotonic() > deadline:
            assert b["status"] in wanted, b
            return dict(b)
        await asyncio.sleep(0.02)


async def lines_of(client: httpx.AsyncClient, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    r = await client.get(f"/v1/files/{file_id}/content")
    assert r.status_code == 200
    return [orjson.loads(x) for x in r.content.splitlines()]


# -- files ------------------------------------------------------------------------------------------------------


async def test_a_file_round_trips_and_belongs_to_its_key(gateway: Callable[..., Any]) -> None:
    async with gateway(FakeUpstream()) as (client, _):
        data = jsonl(2)
        r = await upload(client, data)
        assert r.status_code == 200, r.text
        f = r.json()
        assert f["object"] == "file" and f["purpose"] == "batch" and f["bytes"] == len(data)
        assert f["filename"] == "in.jsonl" and f["id"].startswith("file-") and f["status"] == "processed"
        assert (await client.get(f"/v1/files/{f['id']}")).json() == f
        assert (await client.get(f"/v1/files/{f['id']}/content")).content == data
        listed = (await client.get("/v1/files")).json()
        assert listed["object"] == "list" and [x["id"] for x in listed["data"]] == [f["id"]]
        # another key: as if it did not exist
        for path in (f"/v1/files/{f['id']}", f"/v1/files/{f['id']}/content"):
            assert (await client.get(path, headers=OTHER)).status_code == 404
        assert (await client.delete(f"/v1/files/{f['id']}", headers=OTHER)).status_code == 404
        assert (await client.get("/v1/files", headers=OTHER)).json()["data"] == []
        gone = await client.delete(f"/v1/files/{f['id']}")
        assert gone.json() == {"id": f["id"], "object": "file", "deleted": True}
        assert (await client.get(f"/v1/files/{f['id']}")).status_code == 404


async def test_uploads_that_are_refused(gateway: Callable[..., Any]) -> None:
    async with gateway(FakeUpstream()) as (client, _):
        wrong = await client.post("/v1/files", files={"file": ("x.jsonl", b"{}")}, data={"purpose": "fine-tune"})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
        assert (await upload(client, b"x" * 5000)).status_code == 413  # over batches.max_file_bytes
        assert (await upload(client, b"  \n")).status_code == 400
        assert (await upload(client, b"\xff\xfe")).status_code == 400
        assert (await client.post("/v1/files", json={"purpose": "batch"})).status_code == 400
        assert (await upload(client, b"{}", headers={"authorization": "Bearer nope"})).status_code == 401


# -- batches ----------------------------------------------------------------------------------------------------


async def test_every_line_runs_through_the_service_in_the_batch_class_within_its_bound(
    gateway: Callable[..., Any],
) -> None:
    running = peak = 0

    async def engine(method: str, url: str, headers: Any, body: bytes | None) -> FakeAnswer:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        content = orjson.loads(body or b"{}")["messages"][0]["content"]
        return FakeAnswer.json(answer(f"echo {content}"))

    up = FakeUpstream({("POST", CHAT): engine})
    async with gateway(up) as (client, app):
        created = await create_batch(client, jsonl(20, stream=True))
        assert created["status"] == "in_progress" and created["request_counts"]["total"] == 20
        assert created["endpoint"] == "/v1/chat/completions" and created["model"] == "m"
        done = await until_status(client, created["id"], "completed")
        assert done["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
        assert done["completed_at"] is not None and done["error_file_id"] is None
        out = await lines_of(client, done["output_file_id"])
        assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(20)]  # input order, one line each
        for i, x in enumerate(out):
            assert x["error"] is None and x["response"]["status_code"] == 200
            assert x["response"]["body"]["choices"][0]["message"]["content"] == f"echo line {i}"
            assert x["id"] == "batch_req_" + x["response"]["request_id"]
        sent = up.calls_to(CHAT)
        assert len(sent) == 20
        assert {c.json()["priority"] for c in sent} == {2}  # the batch class (vLLM: lower first)
        assert not any(c.json().get("stream") for c in sent)  # a batch's answers are whole
        assert peak <= 3  # batches.concurrency
        metrics = app.gw.metrics.render().decode()
        assert 'endpoint="chat"' in metrics and "gateway_requests_total" in metrics
        # another key sees none of it
        assert (await client.get(f"/v1/batches/{created['id']}", headers=OTHER)).status_code == 404
        assert (await client.post(f"/v1/batches/{created['id']}/cancel", headers=OTHER)).status_code == 404
        assert (await client.get("/v1/batches", headers=OTHER)).json()["data"] == []
        assert (await client.get(f"/v1/files/{done['output_file_id']}", headers=OTHER)).status_code == 404


async def test_refusals_go_to_the_error_file_and_passing_ones_are_retried(gateway: Callable[..., Any]) -> None:
    calls: dict[str, int] = {}

    def engine(method: str, url: str, headers: Any, body: bytes | None) -> FakeAnswer:
        content = orjson.loads(body or b"{}")["messages"][0]["content"]
        calls[content] = calls.get(content, 0) + 1
        if content == "line 1":  # the engine refuses it for good
            return FakeAnswer.json({"error": {"message": "bad", "type": "BadRequestError", "code": 400}}, 400)
        if content == "line 2" and calls[content] == 1:  # busy once: tried again later
            return FakeAnswer.json({"error": {"message": "busy", "type": "ServiceUnavailable", "code": 503}}, 503)
        return FakeAnswer.json(answer())

    text = CONFIG.replace("models:", "routing: {retries: 0}\nmodels:")
    async with gateway(FakeUpstream({("POST", CHAT): engine}), text) as (client, _):
        created = await create_batch(client, jsonl(4))
        done = await until_status(client, created["id"], "completed")
        assert done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
        out = await lines_of(client, done["output_file_id"])
        err = await lines_of(client, done["error_file_id"])
        assert [x["custom_id"] for x in out] == ["req-0", "req-2", "req-3"]
        assert [x["custom_id"] for x in err] == ["req-1"]
        assert err[0]["response"]["status_code"] == 400 and "error" in err[0]["response"]["body"]
        assert calls["line 2"] == 2 and calls["line 1"] == 1


async def test_an_input_file_with_bad_lines_fails_the_batch_with_their_line_numbers(
    gateway: Callable[..., Any],
) -> None:
    good = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}
    lines = [
        orjson.dumps(good),
        b"not json",
        orjson.dumps({**good, "url": "/v1/embeddings", "custom_id": "b"}),
        orjson.dumps(good),  # the custom_id again
        orjson.dumps({**good, "custom_id": "c", "body": "text"}),
    ]
    up = FakeUpstream()
    async with gateway(up) as (client, _):
        b = await create_batch(client, b"\n".join(lines))
        assert b["status"] == "failed" and b["failed_at"] is not None
        got = [(e["line"], e["code"]) for e in b["errors"]["data"]]
        assert got == [
            (2, "invalid_json_line"),
            (3, "invalid_url"),
            (4, "duplicate_custom_id"),
            (5, "missing_required_parameter"),
        ]
        assert (await client.get(f"/v1/batches/{b['id']}")).json()["status"] == "failed"
    assert up.calls == []


async def test_bad_batch_requests_are_400_or_404(gateway: Callable[..., Any]) -> None:
    async with gateway(FakeUpstream()) as (client, _):
        fid = (await upload(client, jsonl(1))).json()["id"]
        base = {"input_file_id": fid, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        for change, param in (
            ({"endpoint": "/v1/images"}, "endpoint"),
            ({"endpoint": {}}, "endpoint"),  # an object: once a 500 (schemathesis found it)
            ({"completion_window": "forever"}, "completion_window"),
            ({"completion_window": "30d"}, "completion_window"),  # past batches.max_window_s
            ({"metadata": {"k": 1}}, "metadata"),
        ):
            r = await client.post("/v1/batches", json={**base, **change})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert (await client.post("/v1/batches", json=base, headers=OTHER)).status_code == 404
        assert (await client.post("/v1/batches", json={**base, "input_file_id": "file-x"})).status_code == 404
        assert (await client.get("/v1/batches/batch_nope")).status_code == 404
        assert (await client.get("/v1/files?order=")).status_code == 400  # a blank order is a bad one


async def test_a_cancelled_batch_stops_and_says_which_lines_never_ran(gateway: Callable[..., Any]) -> None:
    up = FakeUpstream({("POST", CHAT): first_fast(20)})
    async with gateway(up) as (client, _):
        b = await create_batch(client, jsonl(6))
        await until_status(client, b["id"], "in_progress")
        deadline = time.monotonic() + 10
        while len(up.calls) < 4 and time.monotonic() < deadline:  # the first answered, three more held
            await asyncio.sleep(0.02)
        r = await client.post(f"/v1/batches/{b['id']}/cancel")
        assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled")
        done = await until_status(client, b["id"], "cancelled")
        assert done["cancelled_at"] is not None and done["cancelling_at"] is not None
        out = await lines_of(client, done["output_file_id"])
        err = await lines_of(client, done["error_file_id"])
        assert [x["custom_id"] for x in out] == ["req-0"]
        assert [x["custom_id"] for x in err] == [f"req-{i}" for i in range(1, 6)]
        assert {x["error"]["code"] for x in err} == {"batch_cancelled"}
        assert (await client.post(f"/v1/batches/{b['id']}/cancel")).json()["status"] == "cancelled"
        assert len(up.calls) == 4  # nothing ran after the cancel
    up.assert_all_closed()


async def test_a_batch_past_its_completion_window_expires_honestly(gateway: Callable[..., Any]) -> None:
    up = FakeUpstream({("POST", CHAT): first_fast(0.4)})
    text = CONFIG.replace("concurrency: 3", "concurrency: 1")
    async with gateway(up, text) as (client, _):
        b = await create_batch(client, jsonl(10), window="1s")
        assert b["expires_at"] - b["created_at"] == 1
        done = await until_status(client, b["id"], "expired", timeout=10)
        assert done["expired_at"] is not None and done["completed_at"] is None
        out = await lines_of(client, done["output_file_id"])
        err = await lines_of(client, done["error_file_id"])
        assert 1 <= len(out) < 10 and len(out) + len(err) == 10
        assert {x["error"]["code"] for x in err} == {"batch_expired"}
        assert {x["custom_id"] for x in out + err} == {f"req-{i}" for i in range(10)}


async def test_batches_list_newest_first_in_pages(gateway: Callable[..., Any]) -> None:
    async with gateway(FakeUpstream()) as (client, _):
        ids = [(await create_batch(client, b"bad line"))["id"] for _ in range(3)]
        first = (await client.get("/v1/batches", params={"limit": 2})).json()
        assert first["has_more"] is True and len(first["data"]) == 2
        rest = (await client.get("/v1/batches", params={"limit": 2, "after": first["last_id"]})).json()
        assert rest["has_more"] is False
        assert sorted(x["id"] for x in first["data"] + rest["data"]) == sorted(ids)
        assert (await client.get("/v1/batches", params={"limit": 0})).status_code == 400


async def test_batches_off_is_a_404(gateway: Callable[..., Any]) -> None:
    async with gateway(FakeUpstream(), CONFIG.replace("batches: {", "batches: {enabled: false, ")) as (client, _):
        assert (await upload(client, jsonl(1))).status_code == 404
        assert (await client.get("/v1/batches")).status_code == 404


async def test_batch_lines_wait_behind_interactive_work_for_a_slot(gateway: Callable[..., Any]) -> None:
    """One engine slot: the lines queue for it in the batch class, and a request of the key's own class that arrives
    meanwhile is given the next free slot before them."""
    order: list[str] = []

    async def engine(method: str, url: str, headers: Any, body: bytes | None) -> FakeAnswer:
        order.append(orjson.loads(body or b"{}")["messages"][0]["content"])
        await asyncio.sleep(0.2)
        return FakeAnswer.json(answer())

    text = CONFIG.replace('url: "http://engine.test"', 'url: "http://engine.test", max_concurrency: 1')
    async with gateway(FakeUpstream({("POST", CHAT): engine}), text) as (client, _):
        b = await create_batch(client, jsonl(3))
        deadline = time.monotonic() + 10
        while not order and time.monotonic() < deadline:  # the first line holds the one slot, two wait for it
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        live = {"model": "m", "messages": [{"role": "user", "content": "interactive"}]}
        r = await client.post("/v1/chat/completions", json=live)
        assert r.status_code == 200
        await until_status(client, b["id"], "completed")
    assert order[0] == "line 0" and order[1] == "interactive", order
