"""Files expire: `batch_files.expires_at` (OpenAI's `expires_after` on upload; null: never), indexed for the
runner's sweep (state/batches.py)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_file_expiry"
down_revision: str | None = "0006_batches"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("batch_files", sa.Column("expires_at", sa.BigInteger(), nullable=True))
    op.create_index("ix_batch_files_expires_at", "batch_files", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_batch_files_expires_at", table_name="batch_files")
    op.drop_column("batch_files", "expires_at")
