"""The Batch API across replicas on a real Postgres (tests/support/postgres_server.py): two replicas' stores
claiming the same batch's lines at once never share one (the claim's `FOR UPDATE SKIP LOCKED`), only the lease
holder records, a batch ends once; and two gateway processes running two batches together answer each line exactly
once, by the engine's own count."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_gateway.state.batches import BatchStore
from llm_gateway.state.database import Database
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.e2e.test_batches_sdk import CONCURRENCY, config, finished, sdk, submit
from tests.support.gateway_process import GatewayProcess
from tests.support.postgres_server import PostgresServer, running_postgres
from tests.support.waiting import metric
from tests.unit.test_batch_claims import LEASE_MS, NOW_MS, make_batch

LINES = 120


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


async def test_two_replicas_claim_disjoint_lines_and_end_the_batch_once(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    one, two = await Database.open(url), await Database.open(url)
    try:
        a, b = BatchStore(one), BatchStore(two)
        await make_batch(a, 60)
        claims = await asyncio.gather(
            *(
                s.claim("batch_1", name, 4, NOW_MS, LEASE_MS)
                for _ in range(6)
                for s, name in ((a, "rep_a"), (b, "rep_b"))
            )
        )
        held = {(c.line, name) for batch, name in zip(claims, ["rep_a", "rep_b"] * 6, strict=True) for c in batch}
        lines = [line for line, _ in held]
        assert len(lines) == len(set(lines)) == 48  # 12 claims of 4: every line leased once
        for line, name in held:
            other = "rep_b" if name == "rep_a" else "rep_a"
            assert not await (b if other == "rep_b" else a).record("batch_1", line, other, 200, "x", "{}")
            assert await (a if name == "rep_a" else b).record("batch_1", line, name, 200, f"r{line}", "{}")
        rest = await b.claim("batch_1", "rep_b", 100, NOW_MS, LEASE_MS)
        assert len(rest) == 12
        for c in rest:
            assert await b.record("batch_1", c.line, "rep_b", 200, f"r{c.line}", "{}")
        ended = await asyncio.gather(a.finish("batch_1", "completed", 5), b.finish("batch_1", "completed", 5))
        assert sorted(ended) == [False, True]
        row = await a.batch("batch_1", "kc_alice")
        assert row is not None and (row["status"], row["completed"]) == ("completed", 60)
    finally:
        await one.aclose()
        await two.aclose()


def test_two_gateways_run_two_batches_each_line_once(postgres: PostgresServer, tmp_path: Path) -> None:
    """A batch is woken on the replica that took it and found by the other's poll; each replica runs lines of both
    (the bound is the batch's, across replicas), and every line is generated once."""
    url = postgres.new_database()
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=2 * CONCURRENCY, tpot_ms=5)) as emu:
        text = config(tmp_path / "data", emu.url).replace("auth:", f'database: {{url: "{url}"}}\nauth:')
        with GatewayProcess(text, tmp_path, name="one") as one, GatewayProcess(text, tmp_path, name="two") as two:
            first = submit(sdk(one), tmp_path, LINES)
            second = submit(sdk(two), tmp_path, LINES)
            assert len(finished(sdk(two), first, LINES)) == LINES  # each read from the other replica
            assert len(finished(sdk(one), second, LINES)) == LINES
            ran = [metric(gw.url, "gateway_requests_total", endpoint="chat") or 0 for gw in (one, two)]
            logs = one.log_text() + two.log_text()
        assert sum(ran) == 2 * LINES and min(ran) > 0, ran  # both replicas ran lines, through the service
        assert emu.stats.completed == 2 * LINES  # no lease lapsed: each line generated exactly once
        assert "lease was lost" not in logs
