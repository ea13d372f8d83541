"""The bench run's shared settings: the targets and scenarios bench/run.py knows (their order, which load
each puts on, which API it speaks, which only the gateway serves), the CPU pinning, and `Ctx`, the run-wide
options and state every step of a run reads. Its own module so that the scenario runners, the target
start-stop and run.py's main all read the same tables without importing one another.
"""

from __future__ import annotations

import argparse
import time

import board
import procstat as ps
import targets as tg

BENCH = tg.BENCH
RESULTS = BENCH / "results"
PROXY_CPU, LOAD_CPU = "0", "1"
TARGETS = ("direct", "gateway", "smg", "aiohttp", "naive", "litellm")
# the public boards' scenarios (board.py) run after the repository's own, on the same target process
ORDER = ("rss_idle", "ns_c1", "ns_c64", "st64_c16", "msg64_c16", "resp64_c16", "rss_1k", *board.SCENARIOS, "streams")
DEFAULT_SCENARIOS = ("rss_idle", "ns_c1", "ns_c64", "st64_c16", "msg64_c16", "resp64_c16", "rss_1k", "streams")
LOAD = {
    "ns_c1": ("wrk", 1),
    "ns_c64": ("wrk", 64),
    "st64_c16": ("stream", 16),
    "msg64_c16": ("stream", 16),
    "resp64_c16": ("stream", 16),
}
# the API each streaming scenario speaks (stream_client.py --dialect); the same engine stream behind each
DIALECT = {"st64_c16": "chat", "msg64_c16": "messages", "resp64_c16": "responses"}
# scenarios only the gateway serves: the engine, the naive proxy and the LiteLLM setup here speak chat only
GATEWAY_ONLY = {"msg64_c16": "Anthropic's /v1/messages", "resp64_c16": "OpenAI's /v1/responses"}
ST_TOKENS = 64  # st64: tokens per stream, one per --tpot-ms (1 ms) from the engine
RSS1K_N, RSS1K_TPOT_MS = 1000, 1000  # rss_1k: 1,000 held streams, one token a second each


class Ctx:
    """Run-wide settings and state."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.nice = a.nice
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = RESULTS / f"run-{self.stamp}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.engine: ps.Proc | None = None
        self.engine_ports: list[int] = []
        self.retries_left = a.max_retries_total
        self.current_scenario = ""
        self.current_target = ""

    def load_cmd(self, argv: list[str]) -> list[str]:
        cmd = ["taskset", "-c", LOAD_CPU, *argv]
        return ["nice", "-n", str(self.nice), *cmd] if self.nice else cmd

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.engine_ports[0]}"
