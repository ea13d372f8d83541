"""OpenAI's Batch API: uploaded and produced files, batches, and each batch's lines with their leases and
results (see state/batches.py)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_batches"
down_revision: str | None = "0005_key_ids"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "batch_files",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("purpose", sa.String(), nullable=False),
        sa.Column("filename", sa.String(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_batch_files_owner_created_at", "batch_files", ["owner", "created_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("owner", sa.String(), nullable=False),
        sa.Column("endpoint", sa.String(), nullable=False),
        sa.Column("input_file_id", sa.String(), nullable=False),
        sa.Column("completion_window", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        *(
            sa.Column(f"{stage}_at", sa.BigInteger(), nullable=True)
            for stage in ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
        ),
        sa.Column("output_file_id", sa.String(), nullable=True),
        sa.Column("error_file_id", sa.String(), nullable=True),
        sa.Column("errors", sa.Text(), nullable=True),
        sa.Column("batch_metadata", sa.Text(), nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
    )
    op.create_index("ix_batches_owner_created_at", "batches", ["owner", "created_at"])
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_table(
        "batch_lines",
        sa.Column("batch_id", sa.String(), primary_key=True),
        sa.Column("line", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("custom_id", sa.String(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("lease_owner", sa.String(), nullable=True),
        sa.Column("lease_until", sa.BigInteger(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("request_id", sa.String(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
    )
    op.create_index("ix_batch_lines_batch_id_state", "batch_lines", ["batch_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_batch_lines_batch_id_state", table_name="batch_lines")
    op.drop_table("batch_lines")
    op.drop_index("ix_batches_status", table_name="batches")
    op.drop_index("ix_batches_owner_created_at", table_name="batches")
    op.drop_table("batches")
    op.drop_index("ix_batch_files_owner_created_at", table_name="batch_files")
    op.drop_table("batch_files")
