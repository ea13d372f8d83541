"""Residency acceptance end to end: a request goes to the backend that has its model loaded, and the
choice follows when the loaded set changes.

Two Ollama servers with `OLLAMA_MAX_LOADED_MODELS=1` (one model loaded at a time; loading another
unloads it: server/sched.go `processPending`/`findRunnerToUnload` @fb30760), both serving models X and
Y, X loaded on server 1 and Y on server 2 (each loaded by a request, as `/api/ps` then shows). The
gateway runs as a real process (the default strategy for two deployments, cache_aware, which leaves a
deployment whose model would load cold to the one that has it loaded; probes every 0.5 s) in front of
both: a request for X goes to server 1 every time and leaves both loaded sets as they were (no cold load);
after the sets flip (Y loaded on server 1, X on server 2) the next probes see it and X goes to server 2.

Against the real Ollama (0.5.4, two processes; X and Y are two builds of the tiny GGUF: its scheduler
keys runners by the model file, so one file under two names would be one runner) and against the
Ollama emulator (X and Y with `max_loaded_models: 1`, a 0.3 s load), which also shows its scheduler's
rules directly: eviction, `load_duration`, and an eviction waiting for the running request.

The same acceptance against two real llama-server routers (no `-m`; `--models-dir` holding X and Y, the
two tiny builds, and `--models-max 1`: loading one evicts the least recently used, LC
tools/server/server-models.cpp `unload_lru` @00dd0816129a5210351c78bb90e0828f8eb69f99), each loaded
with `POST /models/load` and read back from `GET /models` `status.value`.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.conftest import engines_started
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import (
    LlamaServer,
    OllamaServer,
    tiny_gguf,
)
from tests.support.waiting import wait_until

X, Y = "res-x", "res-y"
SERVERS = ("s1", "s2")

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
backends:
  - {{name: s1, engine: {engine}, url: "{s1}", probe: {{interval_s: 0.5}}}}
  - {{name: s2, engine: {engine}, url: "{s2}", probe: {{interval_s: 0.5}}}}
models:
{models}
"""


def config(urls: dict[str, str], engine: str = "ollama") -> str:
    caps = "format: gguf, capabilities: [chat, completions]"
    models = "\n".join(
        f"  - {{name: {m}, deployments: [{{backend: s1, model: {m}, {caps}}}, {{backend: s2, model: {m}, {caps}}}]}}"
        for m in (X, Y)
    )
    return CONFIG.format(models=models, engine=engine, **urls)


# -- what both acceptances do --------------------------------------------------------------------------------------


def load(url: str, model: str) -> None:
    """Load `model` on the Ollama at `url` the way Ollama documents it: a generate with no prompt."""
    r = httpx.post(url + "/api/generate", json={"model": model}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["done"] is True


def loaded(url: str) -> set[str]:
    r = httpx.get(url + "/api/ps", timeout=10)
    assert r.status_code == 200, r.text
    return {str(m["name"]).removesuffix(":latest") for m in r.json()["models"]}


Loader = Callable[[str, str], None]
Lister = Callable[[str], set[str]]


def place(urls: dict[str, str], where: dict[str, str], load: Loader = load, loaded: Lister = loaded) -> None:
    """Load model `where[server]` on each server; with one slot each, that is all it has loaded."""
    for server, model in where.items():
        load(urls[server], model)
    for server, model in where.items():
        url, want = urls[server], {model}
        wait_until(lambda u=url, w=want: loaded(u) == w, timeout=60, what=f"{server} to have only {model}")


def gateway_sees(gw: GatewayProcess, where: dict[str, str]) -> None:
    """Wait until the gateway's probes say what is loaded where (the `gateway_deployment_resident` gauge)."""
    want = [
        f'gateway_deployment_resident{{backend="{s}",model="{m}",upstream_model="{m}"}} {1.0 if where[s] == m else 0.0}'
        for s in SERVERS
        for m in (X, Y)
    ]

    def seen() -> bool:
        text = httpx.get(gw.url + "/metrics", timeout=5).text
        return all(line in text for line in want)

    wait_until(seen, timeout=30, what=f"the gateway's probes to see {where}")


def chosen(gw: GatewayProcess, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "temperature": 0}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers["x-gateway-backend"]


def acceptance(gw: GatewayProcess, urls: dict[str, str], load: Loader = load, loaded: Lister = loaded) -> None:
    first = {"s1": X, "s2": Y}
    place(urls, first, load, loaded)
    gateway_sees(gw, first)
    assert [chosen(gw, X) for _ in range(3)] == ["s1"] * 3
    assert chosen(gw, Y) == "s2"
    assert {s: loaded(u) for s, u in urls.items()} == {"s1": {X}, "s2": {Y}}  # no request paid a cold load
    flipped = {"s1": Y, "s2": X}
    place(urls, flipped, load, loaded)
    gateway_sees(gw, flipped)
    assert [chosen(gw, X) for _ in range(3)] == ["s2"] * 3
    assert chosen(gw, Y) == "s1"
    assert {s: loaded(u) for s, u in urls.items()} == {"s1": {Y}, "s2": {X}}


def gateway(urls: dict[str, str], workdir: Path, engine: str = "ollama") -> GatewayProcess:
    gw = GatewayProcess(config(urls, engine), workdir).start()

    def ready() -> bool:
        body = httpx.get(gw.url + "/readyz", timeout=5).json()
        return all(b["state"] == "ready" for b in body["backends"].values())

    try:
        wait_until(ready, what="both backends probed ready")
    except BaseException:
        gw.stop()
        raise
    return gw


# -- the real Ollama -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_ollamas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two real Ollama processes with one loaded model at most, each serving X and Y (two tiny builds)."""
    servers: list[OllamaServer] = []
    with engines_started(servers):
        y_gguf = tiny_gguf("--seed", "4321")
        for name in SERVERS:
            eng = OllamaServer(
                model_name=X,
                num_parallel=1,
                num_ctx=512,
                workdir=tmp_path_factory.mktemp(f"ollama-residency-{name}"),
                env={"OLLAMA_MAX_LOADED_MODELS": "1"},
            )
            servers.append(eng)
            eng.start()
        for eng in servers:
            eng.create_model(Y, y_gguf, eng.workdir / "Modelfile-y")  # at its num_ctx, 512
        yield {name: eng.url for name, eng in zip(SERVERS, servers, strict=True)}


@pytest.mark.real_engine
def test_real_ollama_request_goes_where_its_model_is_loaded_and_follows_a_flip(
    real_ollamas: dict[str, str], tmp_path: Path
) -> None:
    gw = gateway(real_ollamas, tmp_path)
    try:
        acceptance(gw, real_ollamas)
    finally:
        gw.stop()


# -- the real llama-server in router mode --------------------------------------------------------------------------


class LlamaRouter(LlamaServer):
    """llama-server as a router: no `-m`; `--models-dir DIR --models-max 1`, one child per loaded model."""

    def __init__(self, models_dir: Path, workdir: Path) -> None:
        super().__init__(parallel=1, ctx_size=512, metrics=False, workdir=workdir)
        self.models_dir = models_dir

    def _command(self) -> list[str]:
        return [
            str(self.binary), "--models-dir", str(self.models_dir), "--models-max", "1",
            "--host", "127.0.0.1", "--port", str(self.port),
            "-c", str(self.ctx_size), "-np", str(self.parallel), "-t", str(self.threads), "--no-ui",
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def router_load(url: str, model: str) -> None:
    r = httpx.post(url + "/models/load", json={"model": model}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True}


def router_loaded(url: str) -> set[str]:
    r = httpx.get(url + "/models", timeout=10)
    assert r.status_code == 200, r.text
    return {str(m["id"]) for m in r.json()["data"] if m["status"]["value"] == "loaded"}


@pytest.fixture(scope="module")
def real_llama_routers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two real llama-server routers, each with X and Y (two tiny builds) in its --models-dir."""
    models_dir = tmp_path_factory.mktemp("llama-router-models")
    servers: list[LlamaRouter] = []
    with engines_started(servers):
        shutil.copy(tiny_gguf(), models_dir / f"{X}.gguf")
        shutil.copy(tiny_gguf("--seed", "4321"), models_dir / f"{Y}.gguf")
        for name in SERVERS:
            eng = LlamaRouter(models_dir, tmp_path_factory.mktemp(f"llama-router-{name}"))
            servers.append(eng)
            eng.start()
        yield {name: eng.url for name, eng in zip(SERVERS, servers, strict=True)}


@pytest.mark.real_engine
def test_real_llama_router_request_goes_where_its_model_is_loaded_and_follows_a_flip(
    real_llama_routers: dict[str, str], tmp_path: Path
) -> None:
    urls = real_llama_routers
    assert {s: router_loaded(u) for s, u in urls.items()} == {"s1": set(), "s2": set()}  # both ready, none loaded
    gw = gateway(urls, tmp_path, engine="llama-server")
    try:
        gateway_sees(gw, {"s1": "", "s2": ""})  # a router's /health is 200 with nothing loaded: ready, all cold
        acceptance(gw, urls, router_load, router_loaded)
    finally:
        gw.stop()


# -- the emulator --------------------------------------------------------------------------------------------------


def emulated(**knobs: object) -> EmulatorThread:
    return EmulatorThread(
        EmulatorConfig(engine="ollama", model=X, extra_models=(Y,), max_loaded_models=1, load_delay_s=0.3, **knobs)
    )


def test_emulated_ollama_request_goes_where_its_model_is_loaded_and_follows_a_flip(tmp_path: Path) -> None:
    with emulated() as e1, emulated() as e2:
        urls = {"s1": e1.url, "s2": e2.url}
        gw = gateway(urls, tmp_path)
        try:
            acceptance(gw, urls)
        finally:
            gw.stop()


def test_emulated_ollama_one_loaded_model_a_cold_load_evicts_and_reports_its_duration() -> None:
    with emulated() as emu:
        assert loaded(emu.url) == set()
        tags = httpx.get(emu.url + "/api/tags", timeout=5).json()["models"]
        assert [m["name"] for m in tags] == [f"{X}:latest", f"{Y}:latest"]
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": False, "options": {"num_predict": 2}}
        cold = httpx.post(emu.url + "/api/chat", json={"model": X, **body}, timeout=10).json()
        warm = httpx.post(emu.url + "/api/chat", json={"model": X, **body}, timeout=10).json()
        assert loaded(emu.url) == {X}
        assert cold["load_duration"] >= 300_000_000 > warm["load_duration"]  # the 0.3 s load, then none
        other = httpx.post(emu.url + "/api/chat", json={"model": Y, **body}, timeout=10).json()
        assert other["load_duration"] >= 300_000_000
        assert loaded(emu.url) == {Y}  # X was unloaded to make room


def test_emulated_ollama_eviction_waits_for_the_running_request() -> None:
    # X answers 20 tokens at 0.1 s each; Y is asked for while X runs: Y's load waits for X's answer
    async def run(url: str) -> tuple[list[str], set[str]]:
        done: list[str] = []
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:

            async def ask(model: str, tokens: int) -> None:
                opts = {"num_predict": tokens}
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
                r = await c.post("/api/chat", json={**body, "options": opts})
                assert r.status_code == 200, r.text
                done.append(model)

            await c.post("/api/generate", json={"model": X})  # loaded, idle
            long_x = asyncio.create_task(ask(X, 20))
            await wait_running(c)
            await ask(Y, 1)
            await long_x
            ps = {str(m["name"]).removesuffix(":latest") for m in (await c.get("/api/ps")).json()["models"]}
            return done, ps

    with emulated(tpot_ms=100) as emu:
        done, ps = asyncio.run(run(emu.url))
    assert done == [X, Y]  # unloading X waited for its running request
    assert ps == {Y}


async def wait_running(c: httpx.AsyncClient) -> None:
    """Until the emulator has a generation in a slot (`active` in its `/_emulator/stats`)."""
    for _ in range(500):
        stats = (await c.get("/_emulator/stats")).json()
        if stats["active"] > 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no generation started: {stats}")
