"""The usage ledger: one row per generation request (key, model, backend, tokens, timings)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_usage"
down_revision: str | None = "0002_keys"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "usage_ledger",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("backend", sa.String(), nullable=False),
        sa.Column("endpoint", sa.String(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("usage_estimated", sa.Boolean(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
    )
    op.create_index("ix_usage_ledger_at_ms", "usage_ledger", ["at_ms"])
    op.create_index("ix_usage_ledger_key_at_ms", "usage_ledger", ["key", "at_ms"])


def downgrade() -> None:
    op.drop_index("ix_usage_ledger_key_at_ms", table_name="usage_ledger")
    op.drop_index("ix_usage_ledger_at_ms", table_name="usage_ledger")
    op.drop_table("usage_ledger")
