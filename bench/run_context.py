"""The bench run's shared settings: the targets and scenarios bench/run.py knows (their order, which load
each puts on, which API it speaks, which only the gateway serves), the CPU pinning, and `Ctx`, the run-wide
options and state every step of a run reads. Its own module so that the scenario runners, the target
start-stop and run.py's main all read the same tables without importing one another.
"""

from __future__ import annotations

import argparse
import time

import agent_request
import board
import procstat as ps
import targets as tg

BENCH = tg.BENCH
RESULTS = BENCH / "results"
PROXY_CPU, LOAD_CPU = "0", "1"
TARGETS = ("direct", "gateway", "gateway-minimal", "smg", "aiohttp", "naive", "litellm")
#: the gateway's targets and the config profile each runs (targets.PROFILES): `gateway` as a team runs it
#: (budgets, usage ledger, fair queuing with a concurrency cap, admin API, metrics), `gateway-minimal` the
#: bench's earlier config (keys with limits, least-load, metrics), so that what the features cost stays visible
GATEWAYS = {"gateway": "team", "gateway-minimal": "minimal"}
# the agent-sized scenarios (bench/agent_request.py's 74 KB coding-agent request, 20 tools, 46 messages) and
# the API each sends it in: whole answers from wrk, streamed ones (64 tokens at 1 ms) from stream_client.py
AGENT = {
    "ag_c1": "chat",
    "ag_c64": "chat",
    "agmsg_c64": "messages",
    "agresp_c64": "responses",
    "agst_c16": "chat",
    "agmsgst_c16": "messages",
    "agrespst_c16": "responses",
}
# the public boards' scenarios (board.py) run after the repository's own, on the same target process
ORDER = (
    "rss_idle",
    "ns_c1",
    "ns_c64",
    "st64_c16",
    "msg64_c16",
    "resp64_c16",
    *AGENT,
    "rss_1k",
    *board.SCENARIOS,
    "streams",
)
DEFAULT_SCENARIOS = (
    "rss_idle",
    "ns_c1",
    "ns_c64",
    "st64_c16",
    "msg64_c16",
    "resp64_c16",
    *AGENT,
    "rss_1k",
    "streams",
)
LOAD = {
    "ns_c1": ("wrk", 1),
    "ns_c64": ("wrk", 64),
    "st64_c16": ("stream", 16),
    "msg64_c16": ("stream", 16),
    "resp64_c16": ("stream", 16),
    "ag_c1": ("wrk", 1),
    "ag_c64": ("wrk", 64),
    "agmsg_c64": ("wrk", 64),
    "agresp_c64": ("wrk", 64),
    "agst_c16": ("stream", 16),
    "agmsgst_c16": ("stream", 16),
    "agrespst_c16": ("stream", 16),
}
# the API each scenario speaks (its path; stream_client.py --dialect); the same engine answer behind each
DIALECT = {"st64_c16": "chat", "msg64_c16": "messages", "resp64_c16": "responses", **AGENT}
# scenarios only the gateway serves: the engine, the naive proxy and the LiteLLM setup here speak chat only
GATEWAY_ONLY = {
    **{s: "Anthropic's /v1/messages" for s in ("msg64_c16", *(a for a, d in AGENT.items() if d == "messages"))},
    **{s: "OpenAI's /v1/responses" for s in ("resp64_c16", *(a for a, d in AGENT.items() if d == "responses"))},
}
#: the streamed dialect scenarios whose ratio to st64_c16 the report prints (they bring st64_c16 along)
DIALECT_RATIOS = ("msg64_c16", "resp64_c16")
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
        #: the agent-sized request in each dialect (agent_request.py writes them into the run's directory)
        self.agent_bodies = agent_request.write(self.dir / "agent")
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
