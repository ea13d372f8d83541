"""Files expire (OpenAI's `expires_after` on upload, anchor `created_at`): the file object's `expires_at`, set by
the `openai` SDK's own form; from then on the file is a 404 (read, content, delete) and left out of the list, and
the batch runner's sweep deletes its row; bad `expires_after` values are 400s. A file without it never expires."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
import sqlalchemy as sa

from llm_gateway.state.tables import batch_files
from tests.conftest import TEST_KEY
from tests.support.fake_upstream import FakeUpstream
from tests.unit.test_batches import gateway, jsonl  # noqa: F401  # the fixture, used by name

HOUR = 3600


def expiring(seconds: int | str, anchor: str = "created_at") -> dict[str, Any]:
    return {"purpose": "batch", "expires_after[anchor]": anchor, "expires_after[seconds]": str(seconds)}


async def test_the_sdk_sets_expires_after_and_the_file_says_when(gateway: Callable[..., Any]) -> None:  # noqa: F811
    async with gateway(FakeUpstream()) as (client, _):
        sdk = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key=TEST_KEY, http_client=client)
        f = await sdk.files.create(
            file=("in.jsonl", jsonl(1)), purpose="batch", expires_after={"anchor": "created_at", "seconds": HOUR}
        )
        assert f.expires_at == f.created_at + HOUR
        assert (await sdk.files.retrieve(f.id)).expires_at == f.expires_at
        plain = await sdk.files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
        assert plain.expires_at is None


async def test_an_expired_file_is_gone_and_swept(gateway: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    async with gateway(FakeUpstream()) as (client, app):
        soon = (await client.post("/v1/files", files={"file": ("a.jsonl", jsonl(1))}, data=expiring(HOUR))).json()
        kept = (await client.post("/v1/files", files={"file": ("b.jsonl", jsonl(1))}, data={"purpose": "batch"})).json()
        assert (await client.get(f"/v1/files/{soon['id']}")).status_code == 200

        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + HOUR + 1)  # an hour on
        for path in (f"/v1/files/{soon['id']}", f"/v1/files/{soon['id']}/content"):
            r = await client.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert (await client.delete(f"/v1/files/{soon['id']}")).status_code == 404
        assert [f["id"] for f in (await client.get("/v1/files")).json()["data"]] == [kept["id"]]
        assert (await client.get(f"/v1/files/{kept['id']}/content")).status_code == 200

        batches = app.context.batches
        batches.runner.wake()  # the sweep runs in the runner's next tick
        store = await batches.store()
        deadline = real() + 10
        while True:
            async with store.db.begin() as conn:
                ids = set((await conn.execute(sa.select(batch_files.c.id))).scalars())
            if soon["id"] not in ids or real() > deadline:
                break
            await asyncio.sleep(0.02)
        assert ids == {kept["id"]}  # the expired row deleted, the other kept


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (expiring(HOUR, anchor="last_active_at"), "expires_after.anchor"),
        (expiring(HOUR - 1), "expires_after.seconds"),
        (expiring(30 * 24 * HOUR + 1), "expires_after.seconds"),
        (expiring("soon"), "expires_after.seconds"),
        ({"purpose": "batch", "expires_after[seconds]": str(HOUR)}, "expires_after.anchor"),
    ],
)
async def test_bad_expires_after_is_a_400(
    gateway: Callable[..., Any],  # noqa: F811
    fields: dict[str, str],
    param: str,
) -> None:
    async with gateway(FakeUpstream()) as (client, _):
        r = await client.post("/v1/files", files={"file": ("a.jsonl", jsonl(1))}, data=fields)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert (await client.get("/v1/files")).json()["data"] == []
