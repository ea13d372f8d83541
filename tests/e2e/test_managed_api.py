"""API-managed models with REAL engines (issue 38 item 4): engines that load and unload models inside themselves,
driven through their own APIs (adapters/model_loaders.py) under the same memory budget and swap policy as the
engines the gateway starts as processes (tests/e2e/test_managed_llama.py).

One real engine serves two models X and Y (two builds of the tiny GGUF: Ollama keys runners by the file, so one
file under two names would be one runner). The gateway has two managed backends on that one engine, one per
model, each costing 100 MB against a budget of 150: one model at a time. Neither engine limits itself to one
(Ollama's default OLLAMA_MAX_LOADED_MODELS is 3; the router's --models-max is 4 by default), so the engine's
own list of loaded models holding only the last one asked for is the gateway's doing:
- X is loaded directly on the engine before the gateway starts: the gateway adopts it as resident, so its
  first request (for Y) unloads X first;
- alternating requests X, Y, X, Y each succeed, and after each the engine lists that model only;
- two clients, one per model, in parallel: all succeed, and the swaps stay within the batching bound;
- on shutdown the gateway unloads what it holds: the engine lists nothing.
Run against real Ollama (`keep_alive`) and a real llama-server in router mode (`/models/load`, `/models/unload`).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import engines_started
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import LlamaServer, OllamaServer, RealEngine, tiny_gguf
from tests.support.waiting import sample, scrape, wait_until

pytestmark = pytest.mark.real_engine

X, Y = "od-x", "od-y"
CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
managed: {{memory_budget_mb: {{local: 150}}, swap_batch: 2, swap_hold_s: 10}}
backends:
  - {{name: bx, engine: {engine}, url: "{url}", capacity: 1, queue_timeout_s: 120, probe: {{interval_s: 0.5}},
      managed: {{loader: {loader}, memory_mb: 100, start_timeout_s: 60, stop_timeout_s: 30}}}}
  - {{name: by, engine: {engine}, url: "{url}", capacity: 1, queue_timeout_s: 120, probe: {{interval_s: 0.5}},
      managed: {{loader: {loader}, memory_mb: 100, start_timeout_s: 60, stop_timeout_s: 30}}}}
models:
  - {{name: {x}, deployments: [{{backend: bx, model: {x}, format: gguf, capabilities: [chat]}}]}}
  - {{name: {y}, deployments: [{{backend: by, model: {y}, format: gguf, capabilities: [chat]}}]}}
"""


@dataclass
class Engine:
    url: str
    engine: str  # the gateway's engine name
    loader: str  # ManagedConfig.loader
    load: Callable[[str], None]  # load a model directly on the engine (not through the gateway)
    loaded: Callable[[], set[str]]  # what the engine itself says it holds


# -- Ollama ----------------------------------------------------------------------------------------------------


def _ollama(url: str) -> Engine:
    def load(model: str) -> None:
        r = httpx.post(url + "/api/generate", json={"model": model}, timeout=120)
        assert r.status_code == 200 and r.json()["done"] is True, r.text

    def loaded() -> set[str]:
        r = httpx.get(url + "/api/ps", timeout=10)
        assert r.status_code == 200, r.text
        return {str(m["name"]).removesuffix(":latest") for m in r.json()["models"]}

    return Engine(url, "ollama", "ollama", load, loaded)


# -- llama-server in router mode --------------------------------------------------------------------------------


class LlamaRouter(LlamaServer):
    """llama-server as a router: no `-m`; `--models-dir DIR` (its default --models-max, 4: it would keep both)."""

    def __init__(self, models_dir: Path, workdir: Path) -> None:
        super().__init__(parallel=1, ctx_size=512, metrics=False, workdir=workdir)
        self.models_dir = models_dir

    def _command(self) -> list[str]:
        return [
            str(self.binary), "--models-dir", str(self.models_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "-c", str(self.ctx_size), "-np", str(self.parallel), "-t", str(self.threads), "--no-ui",
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def _router(url: str) -> Engine:
    def load(model: str) -> None:
        r = httpx.post(url + "/models/load", json={"model": model}, timeout=30)
        assert r.status_code == 200, r.text
        wait_until(lambda: model in loaded(), timeout=60, what=f"the router to load {model}")

    def loaded() -> set[str]:
        r = httpx.get(url + "/models", timeout=10)
        assert r.status_code == 200, r.text
        return {str(m["id"]) for m in r.json()["data"] if m["status"]["value"] == "loaded"}

    return Engine(url, "llama-server", "llama-router", load, loaded)


@pytest.fixture(params=["ollama", "llama-router"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    servers: list[RealEngine] = []
    y_gguf = tiny_gguf("--seed", "4321")
    with engines_started(servers):
        if request.param == "ollama":
            eng = OllamaServer(model_name=X, num_parallel=1, num_ctx=512, workdir=tmp_path_factory.mktemp("od-ollama"))
            servers.append(eng)
            eng.start()
            eng.create_model(Y, y_gguf, eng.workdir / "Modelfile-y")
            yield _ollama(eng.url)
        else:
            models_dir = tmp_path_factory.mktemp("od-router-models")
            shutil.copy(tiny_gguf(), models_dir / f"{X}.gguf")
            shutil.copy(y_gguf, models_dir / f"{Y}.gguf")
            router = LlamaRouter(models_dir, tmp_path_factory.mktemp("od-router"))
            servers.append(router)
            router.start()
            yield _router(router.url)


def chat(gw: GatewayProcess, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=150)


def test_two_models_of_one_engine_budget_for_one_alternate_through_its_api(engine: Engine, tmp_path: Path) -> None:
    engine.load(X)  # before the gateway: it finds X loaded and counts it
    assert engine.loaded() == {X}
    cfg = CONFIG.format(engine=engine.engine, url=engine.url, loader=engine.loader, x=X, y=Y)
    gw = GatewayProcess(cfg, tmp_path).start()
    try:
        wait_until(
            lambda: sample(scrape(gw.url), "gateway_managed_resident", backend="bx") == 1,
            timeout=30,
            what="the gateway to adopt X as resident",
        )
        for model in (Y, X, Y, X):
            r = chat(gw, model)
            assert r.status_code == 200, r.text
            assert r.headers["x-gateway-backend"] == ("bx" if model == X else "by")
            assert engine.loaded() == {model}, f"after a request for {model}"  # the other one was unloaded

        results: dict[str, list[int]] = {X: [], Y: []}

        def client(model: str) -> None:
            for _ in range(3):
                results[model].append(chat(gw, model).status_code)

        threads = [threading.Thread(target=client, args=(m,)) for m in (X, Y)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert results == {X: [200] * 3, Y: [200] * 3}

        m = scrape(gw.url)
        evicted = sum(sample(m, "gateway_managed_unloads_total", backend=f"b{b}", reason="evicted") or 0 for b in "xy")
        swaps = sample(m, "gateway_managed_swaps_total", host="local") or 0
        assert evicted == swaps >= 4  # X adopted then unloaded, and the four alternations
        assert swaps <= 4 + 6  # the parallel clients: at most one swap per request, never a thrash loop
        assert sample(m, "gateway_managed_load_failures_total") in (0, None)
        assert (sample(m, "gateway_managed_memory_used_mb", host="local") or 0) <= 150
        status = httpx.get(gw.url + "/readyz", timeout=10).json()["backends"]
        assert {status[b]["managed"]["loader"] for b in ("bx", "by")} == {engine.loader}
    finally:
        gw.stop()
    assert engine.loaded() == set(), "the gateway unloads the models it holds when it stops"
