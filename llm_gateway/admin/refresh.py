"""Keeps the runtime keys in memory in step with the keys table, on every replica.

The request path never queries the database: `Authenticator` holds the runtime keys as a table of its
own, swapped whole. This task polls the one-row revision counter every `admin.key_poll_s` (a
primary-key read; every change of a key bumps it in the same transaction, deletions included) and
reloads all keys only when it moved; the replica that made a change refreshes at once. So a key
created, changed, revoked or deleted anywhere takes effect on every replica within one poll interval
plus a query (1 s by default). Unchanged keys keep their `Principal` object across reloads, so the
limiter's per-principal caches stay warm. A revoked key is left out; an expired one stays in the table
and is refused by its expiry, checked on each use. A database that cannot answer keeps the last keys
(logged once per outage, never with its URL) and is tried again at the next poll.
A runtime key whose name a config-file key has (the file was edited while the gateway was down, or
another replica runs another config) is left out too, with an error in the log: names are unique across
both kinds, and a name never stands for two keys. The table is rebuilt when the config's key names
change, so such a key works again once the config key is renamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from llm_gateway.access.keys import RuntimeKey, runtime_key
from llm_gateway.admin.store import KeyRow, KeyStore
from llm_gateway.service.runtime import Gateway
from llm_gateway.settings import GatewayConfig, KeyConfig, Limits
from llm_gateway.state.database import Database

log = logging.getLogger("gateway.admin")

Fingerprint = tuple[Any, ...]


def key_config(row: KeyRow) -> KeyConfig:
    """The row as a key's settings (ValueError when an older version stored it in a form this one refuses)."""
    return KeyConfig(
        name=row.name,
        sha256=row.sha256,
        models=row.models,
        limits=Limits(**row.limits),
        model_limits={g: Limits(**v) for g, v in row.model_limits.items()},
    )


def _fingerprint(row: KeyRow) -> Fingerprint:
    return (
        row.id,
        row.sha256,
        row.models,
        repr(sorted(row.limits.items())),
        repr(sorted(row.model_limits.items())),
        row.expires_at,
    )


class KeyRefresher:
    def __init__(self, gw: Gateway, database: Callable[[], Awaitable[Database]], poll_s: float) -> None:
        self.gw = gw
        self._database = database
        self.poll_s = poll_s
        self.revision: int | None = None  # of the keys installed; None: none loaded yet
        self._table: dict[bytes, RuntimeKey] = {}
        self._by_name: dict[str, tuple[Fingerprint, RuntimeKey]] = {}
        self._rows: list[KeyRow] = []
        self._config_names: frozenset[str] = frozenset()  # of the config the table was built against
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="admin-key-refresh")

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as e:  # the database is down or slow: keep the keys we have, try again
                if not self._failing:
                    log.warning("runtime keys could not be refreshed (%s); the last keys stay", type(e).__name__)
                    self._failing = True
            else:
                if self._failing:
                    log.warning("runtime keys are refreshed again")
                    self._failing = False
            await asyncio.sleep(self.poll_s)

    async def refresh(self) -> bool:
        """Reload the keys when the table's revision moved; True when it did. Also puts the table back on
        a runtime that lacks it (one swapped in by a config reload that did not carry it over)."""
        async with self._lock:
            store = KeyStore(await self._database())
            if self.revision is not None and await store.revision() == self.revision:
                if self.gw.runtime.auth.config_names != self._config_names:  # a reload renamed config keys
                    self._build(self._rows)
                self._install()
                return False
            revision, rows = await store.snapshot()
            self._build(rows)
            self.revision = revision
            self._install()
            return True

    def _build(self, rows: list[KeyRow]) -> None:
        by_name: dict[str, tuple[Fingerprint, RuntimeKey]] = {}
        config_names = self.gw.runtime.auth.config_names
        for row in rows:
            if row.revoked_at is not None:
                continue
            if row.name in config_names:
                log.error(
                    "runtime key %r is refused: a key of the config file has its name (names are unique); "
                    "delete the runtime key (DELETE /admin/keys/%s) or rename the config key",
                    row.name,
                    row.name,
                )
                continue
            fp = _fingerprint(row)
            known = self._by_name.get(row.name)
            if known is not None and known[0] == fp:
                by_name[row.name] = known  # unchanged: the same principal
                continue
            try:
                rk = runtime_key(key_config(row), row.id, row.expires_at)
            except (ValueError, TypeError):  # a row this version cannot read: leave it out, say which (no secret)
                log.error("runtime key %r is malformed in the database; it is refused", row.name)
                continue
            by_name[row.name] = (fp, rk)
        self._by_name = by_name
        self._rows = rows
        self._config_names = config_names
        self._table = {rk.digest: rk for _, rk in by_name.values()}

    async def name_clashes(self, config: GatewayConfig) -> str | None:
        """Why `config` may not be applied (its keys take runtime keys' names, revoked ones included: a
        revoked key stays listed under its name), or None. Asks the database; when it cannot answer, the
        keys of the last refresh decide (a clash missed then is still refused by `_build`)."""
        try:
            rows = await KeyStore(await self._database()).all()
        except Exception as e:  # the database is down: do not hold every config change hostage to it
            log.warning(
                "config reload: the keys table could not be read (%s); checked against the last keys", type(e).__name__
            )
            rows = self._rows
        runtime = {r.name for r in rows}
        taken = sorted(k.name for k in config.auth.keys if k.name in runtime)
        if not taken:
            return None
        return (
            f"auth.keys names {', '.join(map(repr, taken))}, the name of a runtime key (created through the admin "
            "API); names are unique across both kinds: rename the config key, or delete the runtime key first"
        )

    def _install(self) -> None:
        auth = self.gw.runtime.auth
        if auth.runtime_keys is not self._table:
            auth.set_runtime_keys(self._table)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
