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
    # the API key's id (never its name: a name can be freed and taken again); nobody else may read it
    sa.Column("owner", sa.String(), nullable=False),
    sa.Column("model", sa.String(), nullable=False),
    sa.Column("created_at", sa.BigInteger(), nullable=False),  # unix seconds
    # no foreign key: a client may delete a response that a later one continued from
    sa.Column("previous_response_id", sa.String(), nullable=True),
    sa.Column("response", JsonText(), nullable=False),
    sa.Column("input_items", JsonText(), nullable=False),
    sa.Column("conversation", JsonText(), nullable=False),
    sa.Index("ix_responses_owner_created_at", "owner", "created_at"),
)

# each item of a stored response (its new input items, then its output items) by id, so that a later
# request's `item_reference` finds it; whose it is comes from its response (a join on responses.owner), and it
# is deleted with it. Not unique by id: a client may send an item again with the id it was given.
response_items = sa.Table(
    "response_items",
    metadata,
    sa.Column("response_id", sa.String(), primary_key=True),
    sa.Column("position", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("item", JsonText(), nullable=False),
    sa.Index("ix_response_items_id", "id"),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    # a label, unique (and unique across the config file's keys too, which the admin API checks)
    sa.Column("name", sa.String(), primary_key=True),
    # the key's identity, minted at creation and kept across rotation ("kr_" + 24 hex digits): what stored
    # responses, limits, budgets, usage rows and audit entries name
    sa.Column("id", sa.String(), nullable=False),
    # only the SHA-256 digest of the key: the key itself is shown once, when it is created or rotated
    sa.Column("sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("models", JsonText(), nullable=False),  # list of model globs
    sa.Column("limits", JsonText(), nullable=False),  # {"rpm", "tpm", "concurrency"}
    sa.Column("model_limits", JsonText(), nullable=False),  # {glob: limits}
    sa.Column("expires_at", sa.BigInteger(), nullable=True),  # unix seconds
    sa.Column("revoked_at", sa.BigInteger(), nullable=True),  # unix seconds; a revoked key stays listed
    sa.Column("created_at", sa.BigInteger(), nullable=False),
    sa.Column("updated_at", sa.BigInteger(), nullable=False),
    sa.Index("ux_api_keys_id", "id", unique=True),
)

# one row (id 1) whose revision every change of api_keys bumps in the same transaction: the replicas poll
# it (one primary-key read) and reload the keys only when it moved; a deletion moves it too
api_keys_revision = sa.Table(
    "api_keys_revision",
    metadata,
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("revision", sa.BigInteger(), nullable=False),
)

# every admin action: who (the admin key's name), what (action, target key, changed fields), when; never a
# secret or a digest
audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at", sa.BigInteger(), nullable=False),  # unix seconds
    sa.Column("actor", sa.String(), nullable=False),
    sa.Column("action", sa.String(), nullable=False),
    sa.Column("target", sa.String(), nullable=True),  # the key's name
    sa.Column("target_id", sa.String(), nullable=True),  # the key's id (null: from before ids, unknown)
    sa.Column("changes", JsonText(), nullable=True),
    sa.Index("ix_audit_log_at", "at"),
)

# the usage ledger: one row per generation request, written in batches behind the request path
# (llm_gateway.observability.ledger); aggregated per key, model and day by `llm-gateway usage` and /admin/usage
usage_ledger = sa.Table(
    "usage_ledger",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at_ms", sa.BigInteger(), nullable=False),  # unix milliseconds when the request arrived
    sa.Column("day", sa.String(10), nullable=False),  # its UTC date, YYYY-MM-DD (groups the same on both databases)
    sa.Column("request_id", sa.String(), nullable=False),
    sa.Column("key", sa.String(), nullable=False),  # the key's name (a label), never the key
    sa.Column("key_id", sa.String(), nullable=True),  # the key's id (null: a row from before ids, unknown)
    sa.Column("model", sa.String(), nullable=False),  # the public model
    sa.Column("backend", sa.String(), nullable=False),
    sa.Column("endpoint", sa.String(), nullable=False),
    sa.Column("status", sa.Integer(), nullable=False),
    sa.Column("outcome", sa.String(), nullable=False),
    sa.Column("prompt_tokens", sa.Integer(), nullable=False),
    sa.Column("completion_tokens", sa.Integer(), nullable=False),
    sa.Column("usage_estimated", sa.Boolean(), nullable=False),  # the engine never reported usage (a cut stream)
    sa.Column("ttft_ms", sa.Float(), nullable=True),
    sa.Column("duration_ms", sa.Float(), nullable=False),
    sa.Index("ix_usage_ledger_at_ms", "at_ms"),
    sa.Index("ix_usage_ledger_key_at_ms", "key", "at_ms"),
)

# the Batch API's files (state/batches.py): an uploaded JSONL (purpose "batch") or a batch's output or error file
# ("batch_output"), its body in the row, so that every replica serves and runs every file (no shared disk)
batch_files = sa.Table(
    "batch_files",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),  # "file-..."
    sa.Column("owner", sa.String(), nullable=False),  # the API key's id: nobody else may read it
    sa.Column("purpose", sa.String(), nullable=False),
    sa.Column("filename", sa.String(), nullable=False),
    sa.Column("bytes", sa.BigInteger(), nullable=False),
    sa.Column("created_at", sa.BigInteger(), nullable=False),  # unix seconds
    sa.Column("content", sa.LargeBinary(), nullable=False),
    sa.Column("expires_at", sa.BigInteger(), nullable=True),  # unix seconds (OpenAI's expires_after); null: never
    sa.Index("ix_batch_files_owner_created_at", "owner", "created_at"),
    sa.Index("ix_batch_files_expires_at", "expires_at"),
)

# one batch: its OpenAI fields; the counts are kept here once it ended (while it runs they come from its lines)
batches = sa.Table(
    "batches",
    metadata,
    sa.Column("id", sa.String(), primary_key=True),  # "batch_..."
    sa.Column("owner", sa.String(), nullable=False),
    sa.Column("endpoint", sa.String(), nullable=False),
    sa.Column("input_file_id", sa.String(), nullable=False),
    sa.Column("completion_window", sa.String(), nullable=False),
    sa.Column("status", sa.String(), nullable=False),
    sa.Column("model", sa.String(), nullable=True),
    sa.Column("created_at", sa.BigInteger(), nullable=False),
    sa.Column("expires_at", sa.BigInteger(), nullable=False),
    sa.Column("in_progress_at", sa.BigInteger(), nullable=True),
    sa.Column("finalizing_at", sa.BigInteger(), nullable=True),
    sa.Column("completed_at", sa.BigInteger(), nullable=True),
    sa.Column("failed_at", sa.BigInteger(), nullable=True),
    sa.Column("expired_at", sa.BigInteger(), nullable=True),
    sa.Column("cancelling_at", sa.BigInteger(), nullable=True),
    sa.Column("cancelled_at", sa.BigInteger(), nullable=True),
    sa.Column("output_file_id", sa.String(), nullable=True),
    sa.Column("error_file_id", sa.String(), nullable=True),
    sa.Column("errors", JsonText(), nullable=True),  # [{code, line, message, param}]: why it failed validation
    sa.Column("batch_metadata", JsonText(), nullable=True),  # the client's `metadata`
    sa.Column("total", sa.Integer(), nullable=False),
    sa.Column("completed", sa.Integer(), nullable=False),
    sa.Column("failed", sa.Integer(), nullable=False),
    sa.Index("ix_batches_owner_created_at", "owner", "created_at"),
    sa.Index("ix_batches_status", "status"),
)

# each request of a batch, claimed by one replica at a time (a lease: `lease_owner` until `lease_until`), and its
# result, written in the same statement that ends the line: a line is done with its result, or it is redone
batch_lines = sa.Table(
    "batch_lines",
    metadata,
    sa.Column("batch_id", sa.String(), primary_key=True),
    sa.Column("line", sa.Integer(), primary_key=True, autoincrement=False),  # 1-based, as in the input file
    sa.Column("custom_id", sa.String(), nullable=False),
    sa.Column("body", sa.Text(), nullable=False),  # the request body, JSON text as the client sent it
    sa.Column("state", sa.String(), nullable=False),  # pending, done (2xx), failed, expired, cancelled
    sa.Column("lease_owner", sa.String(), nullable=True),  # the replica running it
    sa.Column("lease_until", sa.BigInteger(), nullable=False),  # unix ms; a pending line is free once it passed
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("status_code", sa.Integer(), nullable=True),
    sa.Column("request_id", sa.String(), nullable=True),
    sa.Column("response", sa.Text(), nullable=True),  # the answer's JSON body, as the service answered it
    sa.Index("ix_batch_lines_batch_id_state", "batch_id", "state"),
)
