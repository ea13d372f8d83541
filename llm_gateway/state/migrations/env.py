"""Alembic's entry point, run by `Database.open` on the connection it holds (in a transaction, under the
migration lock); there is no offline (SQL script) mode."""

from __future__ import annotations

from alembic import context

from llm_gateway.state.migrations import VERSION_TABLE
from llm_gateway.state.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the gateway's migrations run from llm_gateway.state.database.Database.open()")
context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
