"""The schema at head, as SQLAlchemy Core tables: what the stores query, and what the migrations must build.

The migrations in `migrations/versions` are the history that builds this schema in a database; they do
not import these tables (a revision stays what it was when it shipped), and a unit test compares a
freshly migrated database against `metadata`, so the two cannot drift apart.

JSON documents are stored as text, encoded with orjson, on both databases: Postgres `jsonb` would
reorder the keys of the objects clients get back and rejects the NUL character a model may emit, and
nothing queries inside the documents. Text has no size limit worth the name on either (1 GB).
"""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Dialect


class JsonText(sa.TypeDecorator[Any]):
    """A JSON document (dict or list) stored as its orjson text."""

    impl = sa.Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else orjson.dumps(value).decode()

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        return None if value is None else orjson.loads(value)


metadata = sa.MetaData()

responses = sa.Table(
    "responses",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),
    sa.Column("owner", sa.String(), nullable=False),  # the API key's name: nobody else may read it
    sa.Column("model", sa.String(), nullable=False),
    sa.Column("created_at", sa.BigInteger(), nullable=False),  # unix seconds
    # no foreign key: a client may delete a response that a later one continued from
    sa.Column("previous_response_id", sa.String(), nullable=True),
    sa.Column("response", JsonText(), nullable=False),
    sa.Column("input_items", JsonText(), nullable=False),
    sa.Column("conversation", JsonText(), nullable=False),
    sa.Index("ix_responses_owner_created_at", "owner", "created_at"),
)
