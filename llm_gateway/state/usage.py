"""The usage ledger in the database: batches of rows in, aggregates out.

Rows come from `llm_gateway.observability.ledger` (one per generation request, buffered behind the request
path) as tuples, the values of `ROW_COLUMNS` in order; a batch is one transaction through
`Database.insert_rows` (on SQLite a few multi-row INSERTs in the database's
writer thread, which also adds the rows' UTC day: bound once for a batch on one day; nothing per row on the
event loop). The
report groups them by any of `DIMENSIONS` over a time range, with the cost of each group priced by the
models' current `price` (a group is summed per model first, so a report by key alone is priced right).
A database that is down or too slow raises `DatabaseUnavailable` (503), as everywhere in `state`.
A key is its id, its name a label: a report by `key` groups by both (`key_id` next to `key`), so a key
created under a deleted key's name is a line of its own; a row from before ids whose key could not be
told (see migrations/versions/0005_key_ids.py) has a null `key_id`.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

from llm_gateway.settings import Price
from llm_gateway.state.database import Database
from llm_gateway.state.sqlite_writer import Batch
from llm_gateway.state.tables import usage_ledger
from llm_gateway.types import USAGE_COLUMNS

DIMENSIONS = ("key", "key_id", "model", "backend", "endpoint", "outcome", "day")
#: the sums of a report row, in the order the table and the CSV show them
MEASURES = ("requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens", "cost")
_SINCE = re.compile(r"^(\d{1,6})([mhdw])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: a replayed row and a stored one of the same key and request id starting this close are the same request
REPLAY_MATCH_MS = 1000
#: the values of a ledger row, in order (one definition: types.USAGE_COLUMNS); the table's `day` is derived
ROW_COLUMNS = USAGE_COLUMNS
_INSERTED = ("day", *ROW_COLUMNS)  # the day first: shared by every row of a batch on one day (`_with_days`)
_DAY_MS = 86_400_000
_AT_MS = itemgetter(0)  # a row's at_ms


class UsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def insert_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Every row (the values of ROW_COLUMNS) in one transaction: written together or not at all."""
        await self.db.insert_rows(usage_ledger, _INSERTED, rows, _with_days)

    async def insert(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """`insert_rows` for rows as dicts named like ROW_COLUMNS (a `day` among them is recomputed)."""
        await self.insert_rows([tuple(r.get(c) for c in ROW_COLUMNS) for r in rows])

    async def insert_missing(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Rows replayed from a crashed process's spool: insert those the table does not hold yet, in one
        transaction, and say how many. A row is held when one of the same key and request id starts within
        `REPLAY_MATCH_MS` of it (the crashed process may have written it just before it died, and a request
        it had in flight may have ended and been written since its last checkpoint)."""
        if not rows:
            return 0
        t = usage_ledger.c
        lo = min(int(r["at_ms"]) for r in rows) - REPLAY_MATCH_MS
        hi = max(int(r["at_ms"]) for r in rows) + REPLAY_MATCH_MS
        ids = sorted({str(r["request_id"]) for r in rows})
        query = sa.select(t.request_id, t.key, t.at_ms).where(t.at_ms.between(lo, hi), t.request_id.in_(ids))
        async with self.db.begin() as conn:
            held: dict[tuple[str, str], list[int]] = {}
            for rid, key, at_ms in (await conn.execute(query)).all():
                held.setdefault((rid, key), []).append(int(at_ms))
            fresh = [
                r
                for r in rows
                if not any(
                    abs(at - int(r["at_ms"])) <= REPLAY_MATCH_MS for at in held.get((r["request_id"], r["key"]), ())
                )
            ]
            if fresh:
                await conn.execute(usage_ledger.insert().values(list(fresh)))
        return len(fresh)

    async def spend_since(self, since_ms: int) -> list[tuple[str, str, str, int, int]]:
        """(key id, model, UTC day, prompt tokens, completion tokens) of the requests since `since_ms`, summed per
        key id, model and day: what budgets on the memory store are restored from at start (limits are scoped
        by the key's id; a row whose key could not be told, null `key_id`, belongs to no key's budget)."""
        t = usage_ledger.c
        query = (
            sa.select(t.key_id, t.model, t.day, sa.func.sum(t.prompt_tokens), sa.func.sum(t.completion_tokens))
            .where(t.at_ms >= since_ms, t.key_id.is_not(None))
            .group_by(t.key_id, t.model, t.day)
        )
        async with self.db.begin() as conn:
            found = (await conn.execute(query)).all()
        return [(str(k), str(m), str(d), int(p or 0), int(c or 0)) for k, m, d, p, c in found]

    async def count(self) -> int:
        async with self.db.begin() as conn:
            return int((await conn.execute(sa.select(sa.func.count()).select_from(usage_ledger))).scalar_one())

    async def report(
        self,
        since_ms: int,
        by: Sequence[str],
        prices: Mapping[str, Price] | None = None,
        until_ms: int | None = None,
    ) -> list[UsageRow]:
        """The requests in [since_ms, until_ms) grouped by `by` (each one of DIMENSIONS), largest total first."""
        dims = shown_dimensions(check_dimensions(by))
        grouped = list(dict.fromkeys([*dims, "model"]))  # priced per model, then summed to `by`
        cols = [usage_ledger.c[d] for d in grouped]
        t = usage_ledger.c
        query = sa.select(
            *cols,
            sa.func.count().label("requests"),
            sa.func.sum(sa.case((t.status >= 400, 1), else_=0)).label("errors"),
            sa.func.sum(t.prompt_tokens).label("prompt_tokens"),
            sa.func.sum(t.completion_tokens).label("completion_tokens"),
        ).where(t.at_ms >= since_ms)
        if until_ms is not None:
            query = query.where(t.at_ms < until_ms)
        query = query.group_by(*cols)
        async with self.db.begin() as conn:
            found = (await conn.execute(query)).all()
        out: dict[tuple[str | None, ...], UsageRow] = {}
        for r in found:
            m = r._mapping
            group = tuple(None if m[d] is None else str(m[d]) for d in dims)
            row = out.get(group)
            if row is None:
                row = out[group] = UsageRow(dict(zip(dims, group, strict=True)))
            prompt, completion = int(m["prompt_tokens"] or 0), int(m["completion_tokens"] or 0)
            row.requests += int(m["requests"])
            row.errors += int(m["errors"] or 0)
            row.prompt_tokens += prompt
            row.completion_tokens += completion
            price = (prices or {}).get(str(m["model"]))
            if price is not None:
                cost = (prompt * price.input_per_million + completion * price.output_per_million) / 1_000_000
                row.cost = (row.cost or 0.0) + cost
        return sorted(
            out.values(), key=lambda r: (-r.total_tokens, -r.requests, tuple(v or "" for v in r.group.values()))
        )


def _order(r: UsageRow) -> tuple[int, int, tuple[str, ...]]:
    """Largest total first, then most requests, then by the group's values (an unknown id as "")."""
    return (-r.total_tokens, -r.requests, tuple(v or "" for v in r.group.values()))


def _with_days(rows: Sequence[Sequence[Any]]) -> Batch:
    """The batch with its rows' UTC day (YYYY-MM-DD of at_ms) in front. On one day, nearly every batch (a flush
    holds a second of requests), the day is a shared value, bound once per statement; across midnight each row
    gets its own (one date formatted per day, not per row)."""
    if not rows:
        return Batch((), rows)
    first = min(map(_AT_MS, rows)) // _DAY_MS
    if max(map(_AT_MS, rows)) // _DAY_MS == first:
        return Batch((_date(first),), rows)
    days: dict[int, str] = {}
    out = []
    for r in rows:
        n = r[0] // _DAY_MS
        day = days.get(n)
        if day is None:
            day = days[n] = _date(n)
        out.append((day, *r))
    return Batch((), out)


def _date(day: int) -> str:
    """Days since the epoch as YYYY-MM-DD."""
    return dt.datetime.fromtimestamp(day * 86_400, dt.UTC).strftime("%Y-%m-%d")


@dataclass(slots=True)
class UsageRow:
    """One group of a report: its dimensions' values and the sums."""

    group: dict[str, str | None]
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None  # None: no model of the group has a price

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.group,
            "requests": self.requests,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cost": None if self.cost is None else round(self.cost, 9),
        }


def check_dimensions(by: Sequence[str]) -> list[str]:
    """`by` without repeats; ValueError naming the allowed ones for anything else."""
    dims = list(dict.fromkeys(d.strip() for d in by if d.strip()))
    bad = [d for d in dims if d not in DIMENSIONS]
    if bad:
        raise ValueError(f"cannot group by {', '.join(map(repr, bad))}: choose from {', '.join(DIMENSIONS)}")
    return dims


def shown_dimensions(dims: Sequence[str]) -> list[str]:
    """The dimensions a report shows: `key_id` follows `key` (a name may have been two keys)."""
    if "key" not in dims or "key_id" in dims:
        return list(dims)
    i = list(dims).index("key") + 1
    return [*dims[:i], "key_id", *dims[i:]]


def parse_since(text: str, now_s: float) -> int:
    """`7d`, `24h`, `30m`, `2w` (before now) or a UTC date `2026-11-01` / time `2026-11-01T12:00:00` -> unix ms."""
    text = text.strip()
    m = _SINCE.match(text)
    if m:
        return int((now_s - int(m.group(1)) * _UNIT_S[m.group(2)]) * 1000)
    try:
        when = dt.datetime.fromisoformat(text.removesuffix("Z"))
    except ValueError:
        raise ValueError(
            "since must be a duration (30m, 24h, 7d, 2w) or a UTC date or time (2026-11-01, 2026-11-01T12:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def _columns(rows: Sequence[UsageRow], by: Sequence[str]) -> list[str]:
    cols = [*shown_dimensions(by), *MEASURES]
    if all(r.cost is None for r in rows):
        cols.remove("cost")
    return cols


def to_csv(rows: Sequence[UsageRow], by: Sequence[str]) -> str:
    cols = _columns(rows, by)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(cols)
    for r in rows:
        d = r.as_dict()
        w.writerow(["" if d[c] is None else _safe_cell(d[c]) for c in cols])
    return buf.getvalue()


def _safe_cell(v: Any) -> Any:
    """A text cell a spreadsheet would run as a formula (=, +, -, @) gets a leading quote."""
    if isinstance(v, str) and v[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + v
    return v


def to_table(rows: Sequence[UsageRow], by: Sequence[str]) -> str:
    """An aligned text table with a total line, for a terminal."""
    cols = _columns(rows, by)
    total = UsageRow(dict.fromkeys(shown_dimensions(by), ""))
    for r in rows:
        total.requests += r.requests
        total.errors += r.errors
        total.prompt_tokens += r.prompt_tokens
        total.completion_tokens += r.completion_tokens
        if r.cost is not None:
            total.cost = (total.cost or 0.0) + r.cost
    if by:
        total.group[by[0]] = "total"

    def cells(r: UsageRow) -> list[str]:
        d = r.as_dict()
        return ["" if d[c] is None else f"{d[c]:.4f}" if c == "cost" else str(d[c]) for c in cols]

    body = [cells(r) for r in rows]
    lines = [cols, *body, cells(total)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(cols))]
    numeric = [c in MEASURES for c in cols]

    def fmt(line: list[str]) -> str:
        return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(line, widths, numeric, strict=True))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(cols), rule, *(fmt(b) for b in body), rule, fmt(cells(total))]).rstrip() + "\n"
