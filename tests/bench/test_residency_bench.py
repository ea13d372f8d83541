"""Smoke of bench/residency.py without processes: the gateway config it writes is valid and carries the
switch it compares, and the report gives the ratio and the cold loads (a second or so)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import residency  # noqa: E402

from tests.conftest import make_config  # noqa: E402


@pytest.mark.parametrize("prefer", [True, False])
def test_the_config_is_valid_and_carries_the_switch(prefer: bool) -> None:
    urls = {"s1": "http://127.0.0.1:1", "s2": "http://127.0.0.1:2"}
    cfg = make_config(residency.gateway_config(urls, prefer, "aiohttp"))
    assert cfg.routing.prefer_resident is prefer
    assert cfg.server.upstream_client == "aiohttp"
    for m in (residency.X, residency.Y):
        route = next(r for r in cfg.models if r.name == m)
        assert [d.backend for d in route.deployments] == ["s1", "s2"]
        assert route.strategy == "least_load"


def test_the_report_gives_the_ratio_and_the_cold_loads() -> None:
    runs = [
        residency.Run("emulator", "residency", [0.01, 0.02, 0.03], 0, 0),
        residency.Run("emulator", "least_load", [2.0, 2.0, 2.1], 3, 0),
    ]
    text = residency.report(runs)
    assert "| emulator | residency | 3 | 20.0 | 30.0 | 0 | 0 |" in text
    assert "p50 x100.0" in text and "cold loads 3 vs 0 of 3" in text
