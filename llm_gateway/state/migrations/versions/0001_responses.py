"""The Responses API's stored responses (`POST /v1/responses` with `store`)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("previous_response_id", sa.String(), nullable=True),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("input_items", sa.Text(), nullable=False),
        sa.Column("conversation", sa.Text(), nullable=False),
    )
    op.create_index("ix_responses_owner_created_at", "responses", ["owner", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_owner_created_at", table_name="responses")
    op.drop_table("responses")
