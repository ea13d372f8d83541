"""LoRA adapters as models on REAL vLLM (CPU) replicas (issue 38 item 5): two vLLM servers of the tiny model, each
started with `--enable-lora --max-lora-rank 8 --max-loras 1` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, behind the
gateway with two tiny PEFT adapters (scripts/make_tiny_lora.py) of the model and `max_adapters: 1` per replica.
- A request for an adapter no replica holds succeeds: the gateway loads it (`POST /v1/load_lora_adapter`) on the
  replica the request went to; the reply differs from the base model's (the adapter is applied);
- the next requests for it land on the replica that loaded it (selection prefers a replica holding it), and only
  that replica lists it;
- a second adapter goes where there is room or unloads an idle one: each replica lists at most one adapter,
  exactly what the gateway's /readyz says it holds, and the loads and unloads are counted.
Two replicas fit here (about 3 GB of memory each); they start once for the module."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import engines_started
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine, VllmServer, tiny_lora
from tests.support.waiting import sample, scrape

pytestmark = pytest.mark.real_engine

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 1}}
backends:
  - {{name: v0, engine: vllm, url: "{u0}", capacity: 2, queue_timeout_s: 120, max_adapters: 1}}
  - {{name: v1, engine: vllm, url: "{u1}", capacity: 2, queue_timeout_s: 120, max_adapters: 1}}
models:
  - name: tiny
    deployments:
      - {{backend: v0, model: tiny-llama, format: safetensors, capabilities: [chat]}}
      - {{backend: v1, model: tiny-llama, format: safetensors, capabilities: [chat]}}
    adapters:
      - {{name: sql, path: "{sql}", aliases: [tiny-sql]}}
      - {{name: poem, path: "{poem}"}}
"""


@pytest.fixture(scope="module")
def vllm_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RealEngine]]:
    servers: list[RealEngine] = []
    with engines_started(servers):
        for i in range(2):
            servers.append(
                VllmServer(
                    max_num_seqs=2,
                    workdir=tmp_path_factory.mktemp(f"vllm-lora-{i}"),
                    extra_args=("--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"),
                    env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
                )
            )
        errors: list[BaseException] = []

        def start(e: RealEngine) -> None:
            try:
                e.start()
            except BaseException as exc:  # told below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(e,)) for e in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        yield servers


def chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def adapters_on(eng: RealEngine) -> set[str]:
    r = httpx.get(eng.url + "/v1/models", timeout=10)
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["data"] if m.get("parent")}


def test_an_adapter_not_loaded_is_loaded_and_the_next_request_lands_on_the_replica_that_loaded_it(
    vllm_pair: list[RealEngine], tmp_path: Path
) -> None:
    sql, poem = tiny_lora("hf"), tiny_lora("hf", "--seed", "8")
    cfg = CONFIG.format(u0=vllm_pair[0].url, u1=vllm_pair[1].url, sql=sql, poem=poem)
    with GatewayProcess(cfg, tmp_path) as gw:
        assert [adapters_on(e) for e in vllm_pair] == [set(), set()]
        base = chat(gw.url, "tiny")
        first = chat(gw.url, "tiny:sql")
        assert base.status_code == 200 and first.status_code == 200, (base.text, first.text)
        text = [r.json()["choices"][0]["message"]["content"] for r in (base, first)]
        assert text[1] != text[0]  # the adapter is applied
        home = first.headers["x-gateway-backend"]
        held = {f"v{i}": adapters_on(e) for i, e in enumerate(vllm_pair)}
        assert held[home] == {"sql"} and all(not v for b, v in held.items() if b != home)
        for _ in range(3):
            r = chat(gw.url, "tiny-sql")
            assert r.status_code == 200 and r.headers["x-gateway-backend"] == home
            assert r.json()["choices"][0]["message"]["content"] == text[1]
        m = scrape(gw.url)
        assert sample(m, "gateway_lora_loads_total", adapter="sql") == 1

        r = chat(gw.url, "tiny:poem")  # room on the other replica, or sql (idle) makes room
        assert r.status_code == 200, r.text
        r = chat(gw.url, "tiny:sql")
        assert r.status_code == 200, r.text
        ready = httpx.get(gw.url + "/readyz", timeout=10).json()["backends"]
        for i, e in enumerate(vllm_pair):
            on = adapters_on(e)
            assert len(on) <= 1  # max_adapters: 1
            assert on == set((ready[f"v{i}"].get("lora") or {}).get("adapters", {}))  # the gateway's book is the truth
        m = scrape(gw.url)
        loads = sum(sample(m, "gateway_lora_loads_total", adapter=a) or 0 for a in ("sql", "poem"))
        unloads = sample(m, "gateway_lora_unloads_total", reason="evicted") or 0
        held_now = sum(len(adapters_on(e)) for e in vllm_pair)
        assert loads - unloads == held_now and loads >= 2
