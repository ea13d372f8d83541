"""API-managed models through emulators (issue 38 item 4; the real-engine acceptance is tests/e2e/test_managed_api.py):
vLLM's sleep mode (`/sleep`, `/wake_up`, `/is_sleeping`: GPU only, so only through the emulator, which follows
vllm/entrypoints/serve/dev/sleep/api_router.py at v0.32.0), LM Studio's load API (closed source: emulated from its
REST documentation), a budget over what the engines hold at start, a load the engine refuses, and the config's
rules for `loader`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from llm_gateway.settings import ManagedConfig
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.waiting import sample, scrape, wait_until

VLLM = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
managed: {{{room}, swap_batch: 2, swap_hold_s: 5}}
backends:
  - {{name: vx, engine: vllm, url: "{x}", capacity: 1, queue_timeout_s: 30, probe: {{interval_s: 0.5}},
      managed: {{loader: vllm-sleep, memory_mb: 100, start_timeout_s: 10}}}}
  - {{name: vy, engine: vllm, url: "{y}", capacity: 1, queue_timeout_s: 30, probe: {{interval_s: 0.5}},
      managed: {{loader: vllm-sleep, memory_mb: 100, start_timeout_s: 10}}}}
models:
  - {{name: mx, deployments: [{{backend: vx, model: mx, format: safetensors}}]}}
  - {{name: my, deployments: [{{backend: vy, model: my, format: safetensors}}]}}
"""


def sleeping(url: str) -> bool:
    r = httpx.get(url + "/is_sleeping", timeout=5)
    assert r.status_code == 200, r.text
    return bool(r.json()["is_sleeping"])


def chat(gw: GatewayProcess, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)


@pytest.fixture
def vllms() -> Iterator[dict[str, str]]:
    knobs = dict(engine="vllm", sleep_mode=True, wake_delay_s=0.3)
    with (
        EmulatorThread(EmulatorConfig(model="mx", **knobs)) as ex,
        EmulatorThread(EmulatorConfig(model="my", **knobs)) as ey,
    ):  # type: ignore[arg-type]
        yield {"mx": ex.url, "my": ey.url}


def test_emulated_vllm_sleep_mode_answers_as_vllm_does(vllms: dict[str, str]) -> None:
    url = vllms["mx"]
    assert sleeping(url) is False  # vLLM starts awake
    r = httpx.post(url + "/sleep?level=1", timeout=5)
    assert r.json() == {"status": "sleeping", "level": 1}
    assert sleeping(url) is True
    assert httpx.post(url + "/sleep?level=3", timeout=5).status_code == 400
    r = httpx.post(url + "/wake_up", timeout=5)
    assert r.json() == {"status": "awake", "tags": None}
    assert sleeping(url) is False


@pytest.mark.parametrize(
    "room",
    ["memory_budget_mb: {local: 150}", "swap_groups: {gpu0: [vx, vy]}"],  # room for one: by memory, or by group
    ids=["budget", "swap_group"],
)
def test_two_vllm_servers_in_sleep_mode_budget_for_one_sleep_and_wake_in_turn(
    vllms: dict[str, str], tmp_path: Path, room: str
) -> None:
    with GatewayProcess(VLLM.format(x=vllms["mx"], y=vllms["my"], room=room), tmp_path) as gw:
        # both awake at start: the gateway counts both (adopted) and puts one to sleep to fit the budget/group
        wait_until(lambda: sleeping(vllms["mx"]) != sleeping(vllms["my"]), timeout=20, what="one server asleep")
        for model in ("mx", "my", "mx", "my"):
            r = chat(gw, model)
            assert r.status_code == 200, r.text
            other = "my" if model == "mx" else "mx"
            assert (sleeping(vllms[model]), sleeping(vllms[other])) == (False, True), f"after {model}"
        m = scrape(gw.url)
        assert (
            sum(sample(m, "gateway_managed_unloads_total", backend=b, reason="over_budget") or 0 for b in ("vx", "vy"))
            == 1
        )
        assert (sample(m, "gateway_managed_swaps_total", host="local") or 0) >= 3
    assert sleeping(vllms["mx"]) and sleeping(vllms["my"])  # the gateway put what it held to sleep on shutdown


LMSTUDIO = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
managed: {{memory_budget_mb: {{local: 150}}, swap_batch: 2, swap_hold_s: 5}}
backends:
  - {{name: lx, engine: lmstudio, url: "{url}", capacity: 1, queue_timeout_s: 30, probe: {{interval_s: 0.5}},
      managed: {{loader: lmstudio, memory_mb: 100, start_timeout_s: 10}}}}
  - {{name: ly, engine: lmstudio, url: "{url}", capacity: 1, queue_timeout_s: 30, probe: {{interval_s: 0.5}},
      managed: {{loader: lmstudio, memory_mb: 100, start_timeout_s: 10}}}}
models:
  - {{name: mx, deployments: [{{backend: lx, model: mx, format: gguf}}]}}
  - {{name: my, deployments: [{{backend: ly, model: my, format: gguf}}]}}
"""


def lms_loaded(url: str) -> set[str]:
    r = httpx.get(url + "/api/v1/models", timeout=5)
    assert r.status_code == 200, r.text
    return {m["key"] for m in r.json()["models"] if m["loaded_instances"]}


def test_emulated_lmstudio_loads_and_unloads_as_its_rest_documentation_says() -> None:
    with EmulatorThread(EmulatorConfig(engine="lmstudio", model="mx", extra_models=("my",))) as emu:
        assert lms_loaded(emu.url) == {"mx"}
        assert chat_at(emu.url, "my").status_code == 404  # not loaded: refused
        r = httpx.post(emu.url + "/api/v1/models/load", json={"model": "my"}, timeout=5).json()
        assert (r["type"], r["instance_id"], r["status"]) == ("llm", "my", "loaded")
        assert chat_at(emu.url, "my").status_code == 200
        assert httpx.post(emu.url + "/api/v1/models/unload", json={"instance_id": "mx"}, timeout=5).json() == {
            "instance_id": "mx"
        }
        assert lms_loaded(emu.url) == {"my"}
        assert httpx.post(emu.url + "/api/v1/models/load", json={"model": "nope"}, timeout=5).status_code == 404


def chat_at(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=10)


def test_two_lmstudio_models_budget_for_one_load_and_unload_in_turn(tmp_path: Path) -> None:
    cfg = EmulatorConfig(engine="lmstudio", model="mx", extra_models=("my",), load_delay_s=0.2)
    with EmulatorThread(cfg) as emu:
        with GatewayProcess(LMSTUDIO.format(url=emu.url), tmp_path) as gw:
            wait_until(lambda: sample(scrape(gw.url), "gateway_managed_resident", backend="lx") == 1, timeout=20)
            for model in ("my", "mx", "my"):
                r = chat(gw, model)
                assert r.status_code == 200, r.text
                assert lms_loaded(emu.url) == {model}, f"after {model}"
            assert (sample(scrape(gw.url), "gateway_managed_swaps_total", host="local") or 0) == 3
        assert lms_loaded(emu.url) == set()  # unloaded on shutdown


def test_a_model_its_engine_refuses_to_load_fails_with_503_not_a_hang(tmp_path: Path) -> None:
    with EmulatorThread(EmulatorConfig(engine="ollama", model="real")) as emu:
        cfg = (
            "auth: {mode: none}\nrouting: {retries: 0}\nbackends:\n"
            f'  - {{name: o, engine: ollama, url: "{emu.url}", queue_timeout_s: 30,'
            " managed: {loader: ollama, max_restarts: 0, start_timeout_s: 5}}\n"
            "models:\n  - {name: ghost, deployments: [{backend: o, model: ghost, format: gguf}]}\n"
        )
        with GatewayProcess(cfg, tmp_path) as gw:
            r = chat(gw, "ghost")
            assert r.status_code == 503, r.text
            assert "failed" in r.text
            assert sample(scrape(gw.url), "gateway_managed_load_failures_total", backend="o") == 1


def test_loader_and_command_go_together_the_way_the_config_says() -> None:
    assert ManagedConfig(command=["engine"]).loader == "process"
    assert ManagedConfig(loader="ollama").command == ()
    with pytest.raises(ValidationError, match="needs a command"):
        ManagedConfig()
    with pytest.raises(ValidationError, match="give no command"):
        ManagedConfig(loader="vllm-sleep", command=["vllm", "serve"])
    with pytest.raises(ValidationError, match="unknown loader 'lmstudio-cli'"):
        ManagedConfig(loader="lmstudio-cli")
