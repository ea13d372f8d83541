"""The Responses API's stored responses: what `store: true` keeps, so that a client can fetch or delete a
response later and continue a conversation from it with `previous_response_id`.

A response belongs to the API key that created it (`owner`, the key's id, never its name: a name can
be freed and taken by another key): every read and delete names the owner, and another key's response is
indistinguishable from one that does not exist. Deleting a runtime key deletes its responses
(in the admin store's transaction that deletes the key, llm_gateway/admin/store.py). Each
record carries the whole conversation so far as OpenAI chat messages, so continuing from it is one read,
however long the chain. Its items (new input items and output items) are also kept by id
(`response_items`), so that a later request's `item_reference`s are found in one query per
`ITEMS_PER_QUERY` references; they belong to the owner of their response (a join, so ownership has one
column) and go with it when it is deleted. A database that is down or too slow raises
`DatabaseUnavailable` (503).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from llm_gateway.state.database import Database
from llm_gateway.state.tables import response_items, responses

#: references looked up by one statement (SQLite bounds a statement's parameters; Postgres' plan stays small)
ITEMS_PER_QUERY = 500


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str  # "resp_..."
    owner: str  # the API key's id: another key must not see it
    model: str
    created_at: int  # unix seconds
    previous_response_id: str | None
    response: dict[str, Any]  # the Response object as answered to the client
    input_items: list[dict[str, Any]]  # this request's input items (GET /v1/responses/{id}/input_items)
    conversation: list[dict[str, Any]]  # chat messages of the whole conversation, this response's output included


class ResponseStore:
    """Stored responses in the gateway's database, one row each, read and deleted only by their owner."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def save(self, r: StoredResponse, items: Sequence[dict[str, Any]] = ()) -> None:
        """Insert, with `items` (each with a string `id`) findable by `load_items`; ids of responses are
        minted by the gateway, so saving one twice is a bug (IntegrityError)."""
        async with self.db.begin() as conn:
            await conn.execute(
                responses.insert().values(
                    id=r.id,
                    owner=r.owner,
                    model=r.model,
                    created_at=r.created_at,
                    previous_response_id=r.previous_response_id,
                    response=r.response,
                    input_items=r.input_items,
                    conversation=r.conversation,
                )
            )
            if items:
                await conn.execute(
                    response_items.insert(),
                    [{"response_id": r.id, "position": i, "id": it["id"], "item": it} for i, it in enumerate(items)],
                )

    async def load_items(self, ids: Collection[str], owner: str) -> dict[str, dict[str, Any]]:
        """The owner's stored items with these ids, by id (an id of another key's, or unknown, is absent);
        an id stored more than once is its latest response's."""
        wanted = list(dict.fromkeys(ids))
        found: dict[str, dict[str, Any]] = {}
        if not wanted:
            return found
        async with self.db.begin() as conn:
            for at in range(0, len(wanted), ITEMS_PER_QUERY):
                query = (
                    sa.select(response_items.c.id, response_items.c.item)
                    .join(responses, responses.c.id == response_items.c.response_id)
                    .where(response_items.c.id.in_(wanted[at : at + ITEMS_PER_QUERY]), responses.c.owner == owner)
                    .order_by(responses.c.created_at, response_items.c.position)
                )
                for row in await conn.execute(query):
                    found[row.id] = row.item
        return found

    async def load(self, response_id: str, owner: str) -> StoredResponse | None:
        """The owner's response; None when the id is unknown or another key's."""
        query = sa.select(responses).where(responses.c.id == response_id, responses.c.owner == owner)
        async with self.db.begin() as conn:
            row = (await conn.execute(query)).one_or_none()
        if row is None:
            return None
        return StoredResponse(
            id=row.id,
            owner=row.owner,
            model=row.model,
            created_at=row.created_at,
            previous_response_id=row.previous_response_id,
            response=row.response,
            input_items=row.input_items,
            conversation=row.conversation,
        )

    async def delete(self, response_id: str, owner: str) -> bool:
        """True when the owner's response existed (and is gone now); another key's stays untouched."""
        query = responses.delete().where(responses.c.id == response_id, responses.c.owner == owner)
        async with self.db.begin() as conn:
            result = await conn.execute(query)
            if result.rowcount > 0:
                await conn.execute(response_items.delete().where(response_items.c.response_id == response_id))
        return result.rowcount > 0
