"""Keys get an immutable id; stored responses, usage rows and audit entries name the key by it.

Before this revision everything named a key by its *name*, so a name freed by deleting a runtime key
and taken by a new one handed the new holder the old key's stored responses (red-team report
2026-12-04, H2). The schema change: `api_keys.id` (unique, not null), `usage_ledger.key_id` and
`audit_log.target_id` (null where unknown); `responses.owner` now holds an id.

The rows already there are mapped by what the database itself records. The audit log has every runtime
key's life, from `key.create` to `key.delete` (both written in the same transaction as the change since
the keys table exists), so each life of a name becomes an id: the live key's is minted and stored in
`api_keys.id`, a deleted key's is minted too and stored nowhere (its rows stay apart from everyone
else's, readable by no key). A row is given the id of the one life of its name that spans its time
(whole seconds, both ends included). A row outside every runtime life belongs to the config-file key of
that name, when the config the gateway opens the database with has one (`config_key_ids`, name -> id,
passed by `Database.from_config`). What cannot be told apart is given to nobody: a time where two lives
of a name meet, or a runtime life of a name that a config key also has. Stored responses given to nobody
keep their row with the owner `legacy:<name>`, which no key's id can be; usage rows and audit entries
keep their name with a null id. `anonymous` (`auth: none`) stays `anonymous`.
"""

from __future__ import annotations

import itertools
import secrets
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0005_key_ids"
down_revision: str | None = "0004_response_items"
branch_labels: str | None = None
depends_on: str | None = None

INF = 2**40  # seconds: far past any row, and still a 64-bit integer in milliseconds
LEGACY = "legacy:"

api_keys = sa.table("api_keys", sa.column("name", sa.String), sa.column("id", sa.String), sa.column("created_at"))
audit_log = sa.table(
    "audit_log",
    sa.column("id"),
    sa.column("at"),
    sa.column("action", sa.String),
    sa.column("target", sa.String),
    sa.column("target_id", sa.String),
)
responses = sa.table("responses", sa.column("owner", sa.String), sa.column("created_at"))
usage_ledger = sa.table("usage_ledger", sa.column("key", sa.String), sa.column("key_id", sa.String), sa.column("at_ms"))


class _Life:
    """One runtime key's life under a name: [start, end] in unix seconds. (Not a dataclass: Alembic loads
    this module outside sys.modules, where dataclasses cannot resolve its annotations.)"""

    __slots__ = ("end", "id", "start")

    def __init__(self, key_id: str, start: int, end: int = INF) -> None:
        self.id, self.start, self.end = key_id, start, end


def _mint() -> str:
    return "kr_" + secrets.token_hex(12)


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("id", sa.String(), nullable=True))
    op.add_column("usage_ledger", sa.Column("key_id", sa.String(), nullable=True))
    op.add_column("audit_log", sa.Column("target_id", sa.String(), nullable=True))
    conn = op.get_bind()
    config_ids: dict[str, str] = dict(context.config.attributes.get("config_key_ids") or {})

    live = {
        r.name: (_mint(), int(r.created_at)) for r in conn.execute(sa.select(api_keys.c.name, api_keys.c.created_at))
    }
    for name, (key_id, _) in live.items():
        conn.execute(api_keys.update().where(api_keys.c.name == name).values(id=key_id))
    lives = _lives(conn, live)
    for name in _names(conn):
        _map_name(conn, name, lives.get(name, []), config_ids.get(name))

    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column("id", existing_type=sa.String(), nullable=False)
    op.create_index("ux_api_keys_id", "api_keys", ["id"], unique=True)


def _lives(conn: Any, live: dict[str, tuple[str, int]]) -> dict[str, list[_Life]]:
    """Each name's runtime key lives, from the audit log; each audit row is given its life's id."""
    lives: dict[str, list[_Life]] = defaultdict(list)
    current: dict[str, _Life] = {}
    rows = conn.execute(
        sa.select(audit_log.c.id, audit_log.c.at, audit_log.c.action, audit_log.c.target)
        .where(audit_log.c.target.is_not(None))
        .order_by(audit_log.c.id)
    ).all()
    for row in rows:
        name, at = row.target, int(row.at)
        life = current.get(name)
        if row.action == "key.create" or life is None:
            life = current[name] = _Life(_mint(), at)
            lives[name].append(life)
        if row.action == "key.delete":
            life.end = at
            del current[name]
        conn.execute(audit_log.update().where(audit_log.c.id == row.id).values(target_id=life.id))
    # the live keys: the life still open under their name is theirs (one with no audit row opens at creation)
    for name, (key_id, created_at) in live.items():
        life = current.get(name)
        if life is None:
            lives[name].append(_Life(key_id, created_at))
        else:
            old = life.id
            life.id = key_id
            conn.execute(audit_log.update().where(audit_log.c.target_id == old).values(target_id=key_id))
    return lives


def _names(conn: Any) -> set[str]:
    owners = conn.execute(sa.select(responses.c.owner).distinct()).scalars()
    keys = conn.execute(sa.select(usage_ledger.c.key).distinct()).scalars()
    return ({*owners} | {*keys}) - {"anonymous"}


def _map_name(conn: Any, name: str, lives: list[_Life], config_id: str | None) -> None:
    lives = sorted(lives, key=lambda life: life.start)
    shared = {a.end for a, b in itertools.pairwise(lives) if a.end >= b.start}  # where two lives meet
    owner, when = responses.c.owner, responses.c.created_at
    key, key_id, at_ms = usage_ledger.c.key, usage_ledger.c.key_id, usage_ledger.c.at_ms
    unowned = LEGACY + name
    for second in shared:  # given to nobody
        conn.execute(responses.update().where(owner == name, when == second).values(owner=unowned))
        conn.execute(
            usage_ledger.update()
            .where(key == name, key_id.is_(None), at_ms >= second * 1000, at_ms < (second + 1) * 1000)
            .values(key_id="")
        )
    for life in lives:
        # a runtime life of a name that a config key also has: either may have made the row
        target_owner = unowned if config_id is not None else life.id
        target_key = "" if config_id is not None else life.id
        conn.execute(
            responses.update().where(owner == name, when >= life.start, when <= life.end).values(owner=target_owner)
        )
        conn.execute(
            usage_ledger.update()
            .where(key == name, key_id.is_(None), at_ms >= life.start * 1000, at_ms < (life.end + 1) * 1000)
            .values(key_id=target_key)
        )
    # outside every runtime life: the config key of that name, else nobody
    conn.execute(responses.update().where(owner == name).values(owner=config_id or unowned))
    if config_id is not None:
        conn.execute(usage_ledger.update().where(key == name, key_id.is_(None)).values(key_id=config_id))
    conn.execute(usage_ledger.update().where(key == name, key_id == "").values(key_id=None))


def downgrade() -> None:
    op.drop_index("ux_api_keys_id", table_name="api_keys")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("id")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("target_id")
    with op.batch_alter_table("usage_ledger") as batch:
        batch.drop_column("key_id")
