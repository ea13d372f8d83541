"""The usage ledger's rows as the crash spool keeps them (observability/ledger.py, observability/spool.py): a
request in flight leaves exactly the row its record would leave with the interrupted outcome, and the spool's
files are, byte for byte, a header line and one `orjson.dumps` line per row (what `recover` reads back)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from llm_gateway.observability.ledger_rows import COLUMNS, finished_row, interrupted_row
from llm_gateway.observability.record import RequestRecord
from llm_gateway.observability.spool import Spool, recover


def record(i: int, *, live: bool, ttft: bool, tokens: bool) -> RequestRecord:
    rec = RequestRecord(f"req-{i}", 100.0 + i / 7, "POST", "/v1/chat/completions", endpoint="chat", key=f"k{i}")
    rec.key_id, rec.model, rec.backend, rec.status, rec.outcome = f"kc_{i}", "m", "b", 200, "success"
    if tokens:
        rec.prompt_tokens, rec.completion_tokens = 10 + i, 3 * i
    rec.ttft_s = 0.0123456 * (i + 1) if ttft else None
    if live:
        rec.live = lambda: (1000 + i, 0 if i % 2 else 7)
    return rec


def reference_interrupted(rec: RequestRecord, now: float, perf: float) -> tuple[object, ...]:
    """What the row of a request in flight is defined as: its record's row, the record copied with status 500,
    outcome interrupted, usage estimated and the tokens a stream relayed so far."""
    gone = dataclasses.replace(rec, status=500, outcome="interrupted", usage_estimated=True)
    if rec.live is not None:
        gone.prompt_tokens, gone.completion_tokens = rec.live()
    return finished_row(gone, now, perf - rec.t0)


@pytest.mark.parametrize("live", [False, True])
@pytest.mark.parametrize("ttft", [False, True])
@pytest.mark.parametrize("tokens", [False, True])
def test_a_request_in_flight_leaves_its_records_row_with_the_interrupted_outcome(live: bool, ttft: bool, tokens: bool):
    for i in range(5):
        rec = record(i, live=live, ttft=ttft, tokens=tokens)
        now, perf = 1_764_590_400.123 + i, 103.75 + i
        got = interrupted_row(rec, now, perf)
        want = reference_interrupted(rec, now, perf)
        assert got == want
        assert [type(v) for v in got] == [type(v) for v in want]
        assert (rec.status, rec.outcome, rec.usage_estimated) == (200, "success", False)  # the record untouched


def test_the_spools_files_are_a_header_and_one_json_line_per_row(tmp_path: Path):
    spool = Spool(tmp_path, COLUMNS)
    recs = [record(i, live=i % 2 == 0, ttft=i % 3 == 0, tokens=i % 4 != 0) for i in range(6)]
    done = [finished_row(r, 1_764_590_400.5 + r.t0, 0.25 * r.t0) for r in recs]
    running = [interrupted_row(r, 1_764_590_401.0, 120.0) for r in recs[:3]]
    header = orjson.dumps({"columns": list(COLUMNS)}) + b"\n"
    spool.write(done[:4], running)
    spool.write(done[4:], running[:1])
    spool.write([], None)
    assert spool.rows_path.read_bytes() == header + b"".join(orjson.dumps(r) + b"\n" for r in done)
    assert spool.open_path.read_bytes() == header + orjson.dumps(running[0]) + b"\n"
    spool.close(keep_rows=True)
    found = recover(tmp_path)
    try:
        assert found.finished == [dict(zip(COLUMNS, r, strict=True)) for r in done]
        assert found.interrupted == []  # closed clean: nothing was in flight any more
    finally:
        found.release()


#: a fresh process (the gateway's heap, not pytest's) encodes a flush's rows in a worker thread, as the
#: ledger's checkpoint does, and prints the minor page faults of 20 flushes once warm
FAULTS = """
import resource, sys
from concurrent.futures import ThreadPoolExecutor
from llm_gateway.observability.spool import _rows
rows = [(1_764_590_400_000 + i, f"req-{i:08d}", f"team-{i % 7}", f"kc_{i % 7:04d}", "model-1", "pool-a", "chat",
         200, "success", 900 + i, 20 + i, i % 4 == 0, None if i % 5 == 0 else 51.5 + i, 250.125) for i in range(500)]
with ThreadPoolExecutor(1) as pool:
    pool.submit(_rows, rows).result()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        pool.submit(_rows, rows).result()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_encoding_a_flushs_rows_for_the_spool_does_not_page_fault_per_row():
    """Holding every row's `orjson.dumps` result until one join made the allocator give memory back to the kernel
    and fault it in again at each flush: ~400 minor page faults per 500 rows (~1 ms of the kernel's time),
    invisible to an instruction count. Encoding and dropping each row's bytes in turn faults nothing once warm."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", FAULTS],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    faults = int(out.stdout)
    assert faults < 500, f"{faults} minor page faults for 20 flushes of 500 rows"


def test_durations_are_milliseconds_to_the_microsecond_as_round_gives_them():
    """The row's ttft_ms and duration_ms: what `round(s * 1000, 3)` gives, computed without a float's `round` to
    digits (which formats and parses the number, twice a row on the request path); at an exact half
    microsecond either neighbour is right."""
    from random import Random

    from llm_gateway.observability.ledger_rows import ms as _ms

    r = Random(36)
    for _ in range(20_000):
        s = r.random() * 10 ** r.randint(-6, 4)
        got = _ms(s)
        assert isinstance(got, float)
        assert got == round(got, 3)  # no more than three decimals
        assert abs(got - s * 1000) <= 0.0005 + 1e-9 * max(1.0, s * 1000)
    assert (_ms(0.0), _ms(1.5), _ms(0.0123456)) == (0.0, 1500.0, 12.346)
