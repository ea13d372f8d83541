"""The revisions, oldest first by number; Alembic orders them by their `down_revision` links."""
