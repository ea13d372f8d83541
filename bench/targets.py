"""The targets the bench compares, and the configs it generates for them.

- `direct`: the fake engine itself (no proxy): the floor every other row is compared against.
- `gateway`: this project as a team runs it, from a generated config (the `team` profile below: keys with
  budgets, the usage ledger on SQLite, fair queuing with a concurrency cap, the admin API, metrics).
- `gateway-minimal`: this project with the `minimal` profile (keys with limits, least-load, metrics), so that
  what the team's features cost stays visible in the same run.
- `naive`: FastAPI + httpx as most people write it (`proxies/naive_httpx.py`, own venv).
- `litellm`: LiteLLM's proxy, one worker, when a LiteLLM venv exists (`$LITELLM_VENV`).
- `smg`: SGLang's / Shepherd Model Gateway (Rust, `pip install smg`, own venv `bench/.venvs/smg`): `smg launch`
  in front of one OpenAI-compatible worker (the engine's first port), `--api-key` on (clients must send it).
- `aiohttp`: the bare floor, aiohttp server + client on uvloop, no features (`proxies/aiohttp_bare.py`).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
API_KEY = os.environ.get("BENCH_API_KEY", "sk-bench-7f3c9a1e5b2d4f6a8c0e1b3d5f7a9c2e")
NAIVE_VENV = Path(os.environ.get("BENCH_NAIVE_VENV", BENCH / ".venvs" / "naive"))
LITELLM_VENV = Path(
    os.environ.get("LITELLM_VENV")
    or next(
        (p for p in ("/tmp/litellm-venv", str(BENCH / ".venvs" / "litellm")) if Path(p, "bin", "litellm").exists()),
        "/tmp/litellm-venv",
    )
)
SMG_VENV = Path(os.environ.get("BENCH_SMG_VENV", BENCH / ".venvs" / "smg"))
PROJECT_PY = os.environ.get("BENCH_PY", sys.executable)
DEFAULT_GATEWAY_CMD = "{py} -m llm_gateway serve --config {config} --host 127.0.0.1 --port {port}"


#: the gateway configs the bench can run: `team` is the gateway as a team runs it (the `gateway` target),
#: `minimal` the bench's config before that (the `gateway-minimal` target), `ledger` minimal + the usage ledger,
#: `traced` minimal + tracing at 100 % sampling to an OTLP/HTTP receiver on 127.0.0.1:4318 (bench/otlp_sink.py);
#: `fairq` and `admin` minimal + one of the team's other features alone, `budget` ledger + the key's budget (a budget
#: on the memory store needs the ledger, which restores it at start): what each feature costs, an attribution
PROFILES = ("team", "minimal", "ledger", "traced", "budget", "fairq", "admin")
#: where the `traced` profile exports its spans (bench/otlp_sink.py's default port)
OTLP_SINK = "http://127.0.0.1:4318"
#: the `team` profile's admin key (the admin API is mounted; the bench never calls it)
ADMIN_KEY = "sk-admin-bench-2c4e6a8b0d1f3a5c7e9b1d3f5a7c9e1b"


def gateway_config(
    engine_urls: list[str], api_key: str = API_KEY, *, profile: str = "minimal", data_dir: Path | None = None
) -> dict:
    """`minimal`: keys (sha256) with RPM/TPM/concurrency limits that never trigger (so the in-memory limiter runs
    on every request), least-load selection over vLLM backends with probes (health, models, /metrics load),
    metrics (always on), config watching; the access log off like every other target. `ledger`: that and the
    usage ledger (`usage: {ledger: true}`, the embedded SQLite in `data_dir`, crash spool on). `team`: that and
    a token and cost budget on the key (reserved and settled per request; a price on the model), a
    gateway-side concurrency cap per deployment that the c64 load reaches (requests queue, in fair-share
    order), and the admin API mounted (an admin key: its key refresher polls the database). `traced`: minimal and
    tracing on, every request sampled, exported over OTLP/HTTP to OTLP_SINK (the A/B of what tracing costs).
    `fairq`, `admin`: minimal and one of team's features alone (the concurrency cap with fair queuing; the admin
    API); `budget`: ledger and the key's budget with the model's price (a budget needs the ledger): to attribute
    team's cost feature by feature."""
    if profile not in PROFILES:
        raise ValueError(f"unknown gateway profile {profile!r}")
    key: dict = {
        "name": "bench",
        "sha256": hashlib.sha256(api_key.encode()).hexdigest(),
        "models": ["*"],
        "limits": {"rpm": 10_000_000, "tpm": 10_000_000_000, "concurrency": 100_000},
    }
    cfg: dict = {
        "server": {
            "host": "127.0.0.1",
            "port": 8080,
            "access_log": False,
            "log_level": "warning",
            "max_connections": 100_000,
        },
        "auth": {"mode": "keys", "keys": [key]},
        "limits": {"store": "memory"},
        "backends": [
            {
                "name": f"engine-{i}",
                "engine": "vllm",
                "url": url,
                "capacity": 256,
                "probe": {"interval_s": 5},
            }
            for i, url in enumerate(engine_urls)
        ],
        "models": [
            {
                "name": "fake-model",
                "strategy": "least_load",
                "deployments": [
                    # tools: the agent-sized request carries tool schemas and calls (a coding agent's model)
                    {
                        "backend": f"engine-{i}",
                        "model": "fake-model",
                        "format": "safetensors",
                        "capabilities": ["chat", "completions", "tools"],
                    }
                    for i in range(len(engine_urls))
                ],
            }
        ],
    }
    if profile == "minimal":
        return cfg
    if profile == "traced":
        cfg["tracing"] = {"enabled": True, "endpoint": OTLP_SINK, "protocol": "http", "sampling_ratio": 1.0}
        return cfg
    if data_dir is not None:
        cfg["server"]["data_dir"] = str(data_dir)
    if profile in ("ledger", "budget", "team"):  # a budget on the memory store needs the ledger (restored from it)
        cfg["usage"] = {"ledger": True}
    if profile in ("budget", "team"):
        key["budget"] = {"tokens": 10_000_000_000_000, "cost": 9_000_000, "period": "month"}  # cost: the most allowed
        cfg["models"][0]["price"] = {"input_per_million": 0.5, "output_per_million": 1.5}
    if profile in ("fairq", "team"):
        for b in cfg["backends"]:
            b["max_concurrency"] = 32  # two deployments: c64 fills both, and bursts queue (fair queuing)
            b["max_queue"] = 4096
        cfg["routing"] = {"fair_queuing": True}
    if profile in ("admin", "team"):
        cfg["admin"] = {"keys": [{"name": "bench-admin", "sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}]}
    return cfg


def write_gateway_config(
    path: Path,
    engine_urls: list[str],
    api_key: str = API_KEY,
    *,
    profile: str = "minimal",
    data_dir: Path | None = None,
) -> Path:
    path.write_text(
        f"# generated by bench/ for one run: the {profile!r} profile, limits that never trigger\n"
        + yaml.safe_dump(
            gateway_config(engine_urls, api_key, profile=profile, data_dir=data_dir or path.parent / "data"),
            sort_keys=False,
        )
    )
    return path


def write_litellm_config(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {
                        "model_name": "fake-model",
                        "litellm_params": {
                            "model": "openai/fake-model",
                            "api_base": "os.environ/UPSTREAM_API_BASE",
                            "api_key": "sk-fake",
                        },
                    }
                ],
                "litellm_settings": {"telemetry": False, "set_verbose": False, "request_timeout": 600},
                "general_settings": {
                    "disable_spend_logs": True,
                    "disable_error_logs": True,
                    "background_health_checks": False,
                },
            },
            sort_keys=False,
        )
    )
    return path


def litellm_available() -> bool:
    return (LITELLM_VENV / "bin" / "litellm").exists()


def naive_available() -> bool:
    return (NAIVE_VENV / "bin" / "python").exists()


def smg_available() -> bool:
    return (SMG_VENV / "bin" / "smg").exists()


# smg 1.13 `smg launch`: one HTTP worker (registered as a generic OpenAI-compatible engine), round robin (the
# cheapest policy; the default cache_aware keeps a radix tree per worker), `--api-key` gating the data-plane
# routes (401 without it), its admission limit (1024 per core, at least 4096: 429 beyond) raised like the gateway's
# limits so that it runs and never triggers, its Prometheus exporter on a free port of ours instead of the fixed
# 29000, logs at warn.
SMG_CMD = (
    "{smg} launch --worker-urls {upstream} --policy round_robin --api-key {key} --host 127.0.0.1 --port {port} "
    "--max-concurrent-requests 100000 --prometheus-host 127.0.0.1 --prometheus-port {aux_port} --log-level warn"
)


def target_command(name: str, gateway_cmd: str | None = None) -> str | None:
    """The shell command of a target, with {port} {aux_port} {config} {py} {upstream} placeholders; None for
    direct."""
    if name == "direct":
        return None
    if name in ("gateway", "gateway-minimal"):  # the same command, each with its own generated config
        return gateway_cmd or DEFAULT_GATEWAY_CMD
    if name == "naive":
        return f"{NAIVE_VENV}/bin/python {BENCH}/proxies/naive_httpx.py"
    if name == "smg":
        return SMG_CMD.replace("{smg}", str(SMG_VENV / "bin" / "smg")).replace("{key}", API_KEY)
    if name == "aiohttp":
        return f"{PROJECT_PY} {BENCH}/proxies/aiohttp_bare.py"
    if name == "litellm":
        return (
            f"{LITELLM_VENV}/bin/litellm --config {{litellm_config}} --host 127.0.0.1 --port {{port}} --num_workers 1"
        )
    raise ValueError(f"unknown target {name!r}")


def target_env(api_key: str = API_KEY) -> dict[str, str]:
    return {
        **os.environ,
        "BENCH_API_KEY": api_key,
        "PYTHONUNBUFFERED": "1",
        # LiteLLM: auth on (it refuses to start without a master key), no cost-map download, quiet, no telemetry
        "LITELLM_MASTER_KEY": api_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_TELEMETRY_DISABLED": "true",
    }
