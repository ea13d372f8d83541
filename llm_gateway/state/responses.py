"""The Responses API's stored responses: what `store: true` keeps, so that a client can fetch or delete a
response later and continue a conversation from it with `previous_response_id`.

A response belongs to the API key that created it (`owner`, the key's id, never its name: a name can
be freed and taken by another key): every read and delete names the owner, and another key's response is
indistinguishable from one that does not exist. Deleting a runtime key deletes its responses
(in the admin store's transaction that deletes the key, llm_gateway/admin/store.py). Each
record carries the whole conversation so far as OpenAI chat messages, so continuing from it is one read,
however long the chain. A database that is down or too slow raises `DatabaseUnavailable` (503).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from llm_gateway.state.database import Database
from llm_gateway.state.tables import responses


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

    async def save(self, r: StoredResponse) -> None:
        """Insert; ids are minted by the gateway, so saving one twice is a bug (IntegrityError)."""
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
        return result.rowcount > 0
