"""The items of stored responses by id, for the Responses API's `item_reference` input items.

Responses stored before this revision keep their items only inside their own row: references to those are
not found (a client then sends the items themselves, as it does with `store: false`)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_response_items"
down_revision: str | None = "0003_usage"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "response_items",
        sa.Column("response_id", sa.String(), primary_key=True),
        sa.Column("position", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("item", sa.Text(), nullable=False),
    )
    op.create_index("ix_response_items_id", "response_items", ["id"])


def downgrade() -> None:
    op.drop_index("ix_response_items_id", table_name="response_items")
    op.drop_table("response_items")
