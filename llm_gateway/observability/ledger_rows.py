"""The usage ledger's rows (observability/ledger.py keeps and writes them): a request as the values of
`USAGE_COLUMNS`, built straight from its record on the request path (one tuple, no copy of the record), the row
a request in flight leaves if the process dies (the crash spool's), and the UTC day a row is filed under.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from llm_gateway.observability.record import NONE, RequestRecord
from llm_gateway.types import USAGE_COLUMNS

COLUMNS = USAGE_COLUMNS
Row = tuple[Any, ...]  # the values of COLUMNS
#: where status, outcome, prompt_tokens, completion_tokens and usage_estimated sit in a row, in that order
_STATUS = COLUMNS.index("status")
assert COLUMNS[_STATUS : _STATUS + 5] == ("status", "outcome", "prompt_tokens", "completion_tokens", "usage_estimated")


def finished_row(rec: RequestRecord, now: float, duration_s: float) -> Row:
    """The values of COLUMNS for a request that ended (or, at a checkpoint, would end) at `now`."""
    return (
        int((now - duration_s) * 1000),
        rec.rid,
        rec.key,
        rec.key_id,
        rec.model,
        rec.backend,
        rec.endpoint,
        rec.status,
        rec.outcome,
        rec.prompt_tokens or 0,
        rec.completion_tokens or 0,
        rec.usage_estimated,
        None if rec.ttft_s is None else ms(rec.ttft_s),
        ms(duration_s),
    )


def interrupted_row(rec: RequestRecord, now: float, perf: float) -> Row:
    """The row a request in flight leaves if the process dies now: outcome `interrupted`, status 500, the
    tokens a stream has relayed so far (estimated). `finished_row`'s, those five values replaced: no copy of the
    record per request per checkpoint."""
    prompt, completion = (rec.prompt_tokens, rec.completion_tokens) if rec.live is None else rec.live()
    row = finished_row(rec, now, perf - rec.t0)
    return (*row[:_STATUS], 500, "interrupted", prompt or 0, completion or 0, True, *row[_STATUS + 5 :])


def ms(seconds: float) -> float:
    """Seconds as milliseconds to the microsecond: `round(seconds * 1000, 3)`'s value, without its decimal
    conversion (a float's `round` to digits formats and parses the number: ~1,100 instructions, twice a row on
    the request path; this is two multiplications and an integer round)."""
    return round(seconds * 1e6) / 1e3


def in_flight(recs: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The generation requests in flight whose key is known (those that will leave a row)."""
    return [r for r in recs if r.key != NONE and r.endpoint != "other"]


def day_of(at_ms: int) -> str:
    return dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC).strftime("%Y-%m-%d")
