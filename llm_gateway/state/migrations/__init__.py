"""The schema's history as Alembic revisions, shipped inside the package and run by `Database.open`.

There is no alembic.ini: `llm_gateway.state.database` points Alembic at this directory and hands
`env.py` the connection it already holds (online mode only). A new revision is a new file in
`versions/` named `NNNN_what.py`, with `revision = "NNNN"` and `down_revision` the previous one; it
spells out its own columns (never importing `tables`), and `tables.py` changes with it.
"""

from __future__ import annotations

from pathlib import Path

MIGRATIONS_DIR = Path(__file__).resolve().parent
#: not Alembic's default `alembic_version`: a shared database may hold another application's
VERSION_TABLE = "llm_gateway_version"
