"""End to end with a real Prometheus server (the Debian binary): it scrapes a gateway process in front
of a streaming engine (llm_gateway_emulators' vLLM, in a thread), evaluates deploy/prometheus/alerts.yml,
and answers the dashboard's queries. The TTFT quantile and the completion-token counter read back
through /api/v1/query must match the traffic that was sent."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from llm_gateway_emulators.textgen import chat_prompt_tokens
from tests.deploy._tools import (
    DASHBOARD,
    PROM_DIR,
    alert_rules,
    dashboard_exprs,
    grafana_to_promql,
    load_json,
    prometheus_bin,
    promtool,
    run,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import free_port

TOKENS = 5
PHASE2_STREAMS = 5
PHASE2_UNARY = 1
STREAM_MESSAGES = [{"role": "user", "content": "count"}]
UNARY_MESSAGES = [{"role": "user", "content": "x"}]


class PrometheusServer:
    """`prometheus` on a free loopback port, 1 s scrapes, TSDB in a temp dir; stopped by PID."""

    def __init__(self, binary: str, workdir: Path, targets: list[str], rule_files: list[str]) -> None:
        self.port = free_port()
        self.workdir = workdir
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files,
            "scrape_configs": [{"job_name": "llm-gateway", "static_configs": [{"targets": targets}]}],
        }
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self.cmd = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus not ready in 30 s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def query(self, expr: str) -> dict[str, Any]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=5)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)["result"]
        if not result:
            return None
        assert len(result) == 1, f"{expr}: {result}"
        return float(result[0]["value"][1])

    def wait_for(self, expr: str, want: float, timeout: float = 20.0) -> float | None:
        deadline = time.monotonic() + timeout
        got = None
        while time.monotonic() < deadline:
            got = self.scalar(expr)
            if got == want:
                return got
            time.sleep(0.25)
        return got


def stream_chat(gw: GatewayProcess) -> tuple[int, list[str]]:
    """One streamed chat through the gateway; returns the status and the content pieces received."""
    pieces: list[str] = []
    body = {"model": "e2e-model", "stream": True, "messages": STREAM_MESSAGES}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in orjson.loads(line[6:]).get("choices", []):
                    if ch.get("delta", {}).get("content"):
                        pieces.append(ch["delta"]["content"])
        return r.status_code, pieces


def vllm_emulator() -> EmulatorThread:
    """The vLLM emulator: first token after 50 ms, then one every 10 ms, TOKENS tokens per answer
    (no max_tokens in the requests: the emulated EOS comes after natural_stop_tokens)."""
    config = EmulatorConfig(engine="vllm", model="fake-model", ttft_ms=50, tpot_ms=10, natural_stop_tokens=TOKENS)
    return EmulatorThread(config)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    binary = prometheus_bin()
    workdir = tmp_path_factory.mktemp("prom-e2e")
    with vllm_emulator() as engine:
        metrics_port = free_port()
        config = f"""
        server: {{access_log: false, metrics_port: {metrics_port}}}
        auth: {{mode: none}}
        backends:
          - {{name: fake-vllm, engine: vllm, url: "{engine.url}", probe: {{interval_s: 0.5}}}}
        models:
          - name: e2e-model
            deployments:
              - {{backend: fake-vllm, model: fake-model, format: safetensors}}
        """
        gw = GatewayProcess(config, workdir, env={"PYTHONWARNINGS": "ignore"})
        prom = PrometheusServer(binary, workdir, [f"127.0.0.1:{gw.port}"], [str(PROM_DIR / "alerts.yml")])
        try:
            gw.start()
            prom.start()
            # phase 1 creates the series and lets Prometheus scrape them once, so that rate() sees phase 2
            status, pieces = stream_chat(gw)
            assert status == 200 and len(pieces) == TOKENS
            assert prom.wait_for("sum(gateway_completion_tokens_total)", TOKENS) == TOKENS, prom.log_path.read_text()
            received = [len(pieces)]
            for _ in range(PHASE2_STREAMS):
                status, pieces = stream_chat(gw)
                assert status == 200
                received.append(len(pieces))
            for _ in range(PHASE2_UNARY):
                r = httpx.post(
                    gw.url + "/v1/chat/completions",
                    json={"model": "e2e-model", "messages": UNARY_MESSAGES},
                    timeout=30,
                )
                assert r.status_code == 200
                received.append(r.json()["usage"]["completion_tokens"])
            yield {
                "prom": prom,
                "gw": gw,
                "engine": engine,
                "metrics_port": metrics_port,
                "received": received,
                "workdir": workdir,
            }
        finally:
            prom.stop()
            gw.stop()


def test_prometheus_reads_back_the_completion_tokens_streamed(stack):
    prom, engine = stack["prom"], stack["engine"]
    sent = engine.stats.tokens_generated_total  # completion tokens the engine produced
    assert sent == TOKENS * (1 + PHASE2_STREAMS + PHASE2_UNARY)
    assert sum(stack["received"]) == sent  # what the clients got is what the engine produced
    got = prom.wait_for("sum(gateway_completion_tokens_total)", sent)
    assert got == sent
    by_model = prom.query('sum by (model, backend) (gateway_completion_tokens_total{model="e2e-model"})')["result"]
    assert [(r["metric"], float(r["value"][1])) for r in by_model] == [
        ({"model": "e2e-model", "backend": "fake-vllm"}, sent)
    ]
    prompt = (
        chat_prompt_tokens(STREAM_MESSAGES) * (1 + PHASE2_STREAMS) + chat_prompt_tokens(UNARY_MESSAGES) * PHASE2_UNARY
    )
    assert engine.stats.prompt_tokens_total == prompt  # the prompt tokens the engine reported in its usage
    assert prom.scalar("sum(gateway_prompt_tokens_total)") == prompt


def test_prometheus_computes_a_plausible_ttft_quantile(stack):
    prom = stack["prom"]
    expr = "histogram_quantile(0.5, sum by (le) (rate(gateway_time_to_first_token_seconds_bucket[1m])))"
    deadline = time.monotonic() + 15
    q = None
    while time.monotonic() < deadline:  # rate() needs a scrape after phase 2
        q = prom.scalar(expr)
        if q is not None and not math.isnan(q):
            break
        time.sleep(0.25)
    assert q is not None and math.isfinite(q), f"TTFT p50 from Prometheus: {q}"
    # the engine sends its first token after 50 ms: the median lies in the bucket that holds it
    assert 0.025 <= q <= 2.5, q
    p95 = prom.scalar(expr.replace("0.5,", "0.95,").replace("sum by (le)", "sum by (le, model)"))
    assert p95 is not None and math.isfinite(p95) and p95 >= q
    streams = prom.scalar("sum(increase(gateway_time_to_first_token_seconds_count[1m]))")
    assert streams is not None and streams > 0
    itl = prom.scalar("sum(rate(gateway_inter_token_latency_seconds_count[1m]))")
    assert itl is not None and itl > 0, "inter-token latency observed for real streams"


def test_alert_rules_evaluate_without_errors_on_live_data(stack):
    prom = stack["prom"]
    deadline = time.monotonic() + 15
    rules: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        groups = httpx.get(prom.url + "/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r["health"] != "unknown" for r in rules):
            break
        time.sleep(0.25)
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, bad
    firing = httpx.get(prom.url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    assert not [a for a in firing if a["state"] == "firing"], firing  # a healthy stack raises nothing


def test_every_dashboard_query_evaluates_and_the_key_panels_have_data(stack):
    prom = stack["prom"]
    empty = []
    for title, expr in dashboard_exprs(load_json(DASHBOARD)):
        data = prom.query(grafana_to_promql(expr))  # asserts status success (no evaluation error)
        if not data["result"]:
            empty.append(title)
    for must in (
        "Request rate by model",
        "Time to first token p50 / p95",
        "Completion tokens / s by model and backend",
        "In-flight requests per backend",
        "Backend up",
        "Circuit breakers",
        "Gateway overhead p50 / p99",
    ):
        assert must not in empty, f"panel {must!r} shows no data on a live stack"


def test_metrics_port_serves_the_exposition(stack):
    r = httpx.get(f"http://127.0.0.1:{stack['metrics_port']}/metrics", timeout=5)
    assert r.status_code == 200, r.text
    out = run([promtool(), "check", "metrics"], input=r.text, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_scrape_target_is_healthy(stack):
    targets = httpx.get(stack["prom"].url + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    assert [(t["labels"]["job"], t["health"]) for t in targets] == [("llm-gateway", "up")], targets
    assert os.path.exists(stack["workdir"] / "data")
