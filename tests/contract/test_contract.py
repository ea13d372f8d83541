"""One contract, every adapter: the same cases run against each engine through a gateway process.

Real processes for llama-server, vLLM and Ollama; emulators (built from the engines' sources and raw
captures) for SGLang, TabbyAPI and LMDeploy, and for the three others as well (fast, and they can
inject what the real tiny engines cannot). The gateway talks to each with its production
(aiohttp) client.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_gateway.adapters.registry import adapter_for
from llm_gateway.routing.prober import BackendProbeClient
from llm_gateway.types import BackendInfo
from llm_gateway.upstream.aiohttp_client import AiohttpUpstream
from tests.contract.targets import FORMATS, HAS_AUTH, REPORTS_LOAD, Target, open_target, poll
from tests.support.gateway_process import GatewayProcess
from tests.support.raw_http import request_bytes

TARGETS = [
    "llama-server/real",
    "vllm/real",
    "ollama/real",
    "mlx/real",
    "sglang/emulator",
    "tabbyapi/emulator",
    "lmdeploy/emulator",
    "llama-server/emulator",
    "vllm/emulator",
    "ollama/emulator",
    "aphrodite/emulator",
    "trtllm/emulator",
    "tgi/emulator",
    "mlc/emulator",
    "lmstudio/emulator",
    "dynamo/emulator",
]
CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
backends:
  - {{name: good, engine: {engine}, url: "{url}", api_key: "{key}", capacity: 4, probe: {{interval_s: 0.5}}}}
  - {{name: badkey, engine: {engine}, url: "{url}", api_key: "wrong-engine-key", probe: {{interval_s: 0.5}}}}
  - name: short
    engine: {engine}
    url: "{url}"
    api_key: "{key}"
    probe: {{interval_s: 0.5}}
    timeouts: {{first_byte_s: 0.5}}
models:
  - {{name: m, deployments: [{{backend: good, model: "{model}", format: {fmt}}}]}}
  - {{name: m-badkey, deployments: [{{backend: badkey, model: "{model}", format: {fmt}}}]}}
  - {{name: m-timeout, deployments: [{{backend: short, model: "{model}", format: {fmt}}}]}}
  - {{name: m-missing, deployments: [{{backend: good, model: "no-such-upstream-model", format: {fmt}}}]}}
  # a window configured wider than the engine's: the gateway sends what only the engine refuses
  - {{name: m-wide, deployments: [{{backend: good, model: "{model}", format: {fmt}, context_length: 1000000}}]}}
"""
MSG = [{"role": "user", "content": "Tell me about llamas."}]


@pytest.fixture(scope="module", params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from open_target(request)


@pytest.fixture(scope="module")
def gateway(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(**target.config_fields)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw"), startup_timeout=60) as gw:
        yield gw


def chat(gw: GatewayProcess, model: str = "m", **extra: object) -> httpx.Response:
    body = {"model": model, "messages": MSG, "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)


def stream_events(gw: GatewayProcess, **extra: object) -> list[str]:
    body = {"model": "m", "messages": MSG, "max_tokens": 8, "temperature": 0, "stream": True, **extra}
    with httpx.Client(timeout=60) as c, c.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


def assert_envelope(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# -- the cases ------------------------------------------------------------------------------------------


def test_non_streaming(gateway: GatewayProcess, target: Target) -> None:
    r = chat(gateway)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == "m"
    ch = out["choices"][0]
    assert ch["message"]["role"] == "assistant" and ch["message"]["content"]
    assert ch["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 8
    assert r.headers["x-gateway-engine"] == target.engine


def test_streaming_relays_every_token_and_ends_with_done(gateway: GatewayProcess, target: Target) -> None:
    ev = stream_events(gateway)
    assert ev[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in ev[:-1]]
    assert all("error" not in c for c in chunks), chunks
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) >= 7  # one chunk per token (a first token may be empty-text on some engines)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c.get("usage") is None for c in chunks)


def test_usage_is_reported_when_asked(gateway: GatewayProcess, target: Target) -> None:
    ev = stream_events(gateway, stream_options={"include_usage": True})
    assert ev[-1] == "[DONE]"
    last = orjson.loads(ev[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8


#: engines that match a stop string by its token ids (MLX-LM 0.32.2: `make_stop_sequences` in mlx_lm/server.py
#: tokenises the stop word on its own), so only a string that tokenises alone as it does in the reply stops it;
#: another one is cut out of the text and the generation goes on to `max_tokens` (seen on the real server)
STOP_BY_TOKENS = {"mlx"}


def whole_token_stop(gw: GatewayProcess) -> tuple[str, str]:
    """(the text of a 16-token reply, one of its middle word-initial tokens (" word": the tokeniser's
    Metaspace gives a lone stop word that same token) whose first occurrence is its own place)."""
    pieces = [
        d for e in stream_events(gw, max_tokens=16)[:-1] for c in orjson.loads(e)["choices"][:1]
        if (d := (c.get("delta") or {}).get("content"))
    ]  # fmt: skip
    text = "".join(pieces)
    for i in range(1, len(pieces)):
        if pieces[i][:1] == " " and pieces[i].strip() and text.find(pieces[i]) == len("".join(pieces[:i])):
            return text, pieces[i]
    raise AssertionError(f"no token of {pieces!r} fits as a stop string: the case would prove nothing")


def test_stop_strings_end_with_finish_reason_stop(gateway: GatewayProcess, target: Target) -> None:
    if target.engine in STOP_BY_TOKENS:
        text, stop = whole_token_stop(gateway)
    else:
        text = chat(gateway, max_tokens=16).json()["choices"][0]["message"]["content"]
        k = len(text) // 2
        stop = text[k : k + 2]
    r = chat(gateway, max_tokens=16, stop=[stop])
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop", (text, stop, ch)
    assert ch["message"]["content"] == text[: text.find(stop)]


def test_engine_error_bodies_become_openai_envelopes(gateway: GatewayProcess, target: Target) -> None:
    e = target.engine_error()
    if e.path == "/v1/chat/completions":
        r = chat(gateway, e.model, **e.body)
    else:
        r = httpx.post(gateway.url + e.path, json={"model": e.model, "max_tokens": 8, **e.body}, timeout=60)
    err = assert_envelope(r, e.status)
    if e.code:
        assert err["code"] == e.code
    if e.text:
        assert e.text in err["message"].lower()
    assert r.headers.get("x-gateway-backend") == "good" or "good" in err["message"]


def test_auth_failure_toward_the_engine_is_the_gateways_problem(gateway: GatewayProcess, target: Target) -> None:
    if target.engine not in HAS_AUTH:
        if target.engine == "ollama":
            pytest.skip("ollama has no authentication of its own")
        pytest.skip(f"{target.engine}'s server takes no API key")
    r = chat(gateway, "m-badkey")
    if r.status_code == 503:  # the probe already saw the 401 and took the backend out
        err = assert_envelope(r, 503)
        assert "badkey" in err["message"] and "401" in err["message"]
    else:
        err = assert_envelope(r, 502)
        assert err["code"] == "upstream_auth_failed" and "badkey" in err["message"]
    assert "wrong-engine-key" not in r.text


def gateway_duration(gw: GatewayProcess, model: str) -> tuple[float, float]:
    """(count, sum) of gateway_request_duration_seconds for `model`, as the gateway itself measured them."""
    count = total = 0.0
    for fam in text_string_to_metric_families(httpx.get(gw.url + "/metrics", timeout=10).text):
        if fam.name == "gateway_request_duration_seconds":
            for s in fam.samples:
                if s.labels.get("model") == model:
                    if s.name.endswith("_count"):
                        count += s.value
                    elif s.name.endswith("_sum"):
                        total += s.value
    return count, total


def test_timeout_before_the_first_byte_is_504(gateway: GatewayProcess, target: Target) -> None:
    # A whole answer's headers come after the whole generation, and this one cannot start before the
    # load is released: every slot of the engine is held by generations that run until the block ends
    # (emulators: a first token an hour away), and its own 3,000 tokens take seconds more (3 to 7 s
    # alone here). So a 504 is first_byte_s (0.5 s) at work; the gateway's other timeouts are 120 s and
    # more. The upper bound only tells first_byte_s from them: a slow machine may take seconds to
    # deliver the 504. (llama-server generates an abandoned whole answer to its end: hence 3,000.)
    before = gateway_duration(gateway, "m-timeout")
    with target.busy():
        r = chat(gateway, "m-timeout", max_tokens=3000 if target.real else 8)
    err = assert_envelope(r, 504)
    assert err["code"] == "upstream_timeout"
    # timed by the gateway itself, from the request to its last byte
    count, total = gateway_duration(gateway, "m-timeout")
    took = total - before[1]
    assert count == before[0] + 1
    # (the lower bound allows 10 ms: the timeout runs on the event loop's clock, the duration on
    # perf_counter, and a timer may fire a hair before its deadline on the other clock: 0.4999 s seen)
    assert 0.49 <= took < 60.0, f"504 after {took:.3f}s; gateway log tail:\n{gateway.log_text()[-4000:]}"


def test_client_disconnect_stops_the_generation(gateway: GatewayProcess, target: Target) -> None:
    """A streamed request whose client leaves after three chunks: the engine stops generating."""
    max_tokens = target.long_tokens()
    body = {"model": "m", "messages": MSG, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    with target.paced():
        before = target.work()
        with httpx.Client(timeout=60) as c, c.stream("POST", gateway.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            target.read_while_generating(r.iter_lines(), 3)
        target.assert_stopped(before, max_tokens)


def test_client_disconnect_stops_a_whole_answer(gateway: GatewayProcess, target: Target) -> None:
    """A non-streamed request whose client closes its socket mid-generation: the gateway's disconnect
    watcher (armed after 0.25 s) cancels the upstream call, and the engine stops generating (or, where
    the engine ignores a client that left, the gateway is seen to have closed the connection)."""
    max_tokens = target.whole_tokens()
    body = {"model": "m", "messages": MSG, "max_tokens": max_tokens, "temperature": 0}
    with target.paced():
        before = target.work()
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=60) as s:
            t0 = time.monotonic()
            s.sendall(
                request_bytes("POST", "/v1/chat/completions", {"content-type": "application/json"}, orjson.dumps(body))
            )
            target.wait_generating()
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))  # past the 0.25 s before the watcher is armed
            assert target.work().generating, "the engine was not generating when the client left: this proves nothing"
        if target.stops_whole_answers:
            target.assert_stopped(before, max_tokens)
        else:
            target.assert_upstream_closed(before)


def test_model_discovery_and_load_probe(target: Target) -> None:
    async def probe() -> tuple:
        up = AiohttpUpstream()
        try:
            from llm_gateway.routing.table import Backend
            from llm_gateway.settings import BackendConfig, ProbeConfig
            from llm_gateway.upstream.base import UpstreamTimeouts

            # generous timeouts: a probe of an engine that saturates both cores may take seconds
            cfg = BackendConfig(
                name="b",
                engine=target.engine,
                url=target.url,
                api_key=target.api_key,
                probe=ProbeConfig(timeout_s=30),
            )
            adapter = adapter_for(target.engine, BackendInfo("b", target.url, target.api_key))
            b = Backend(cfg, adapter, UpstreamTimeouts(30, 30, 30, 30))
            idle = await adapter.probe(BackendProbeClient(up, b))
            with target.busy():  # held until the probe has seen it: engines refresh gauges on their own schedule
                deadline = time.monotonic() + 60
                while True:
                    busy = await adapter.probe(BackendProbeClient(up, b))
                    if busy.load is None or (busy.load.running or 0) + (busy.load.waiting or 0) >= 1:
                        break
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.1)
            return idle, busy
        finally:
            await up.aclose()

    idle, busy = asyncio.run(probe())
    assert idle.state == "ready" and busy.state == "ready"
    assert idle.models is not None and target.model in idle.models
    if target.engine in REPORTS_LOAD:
        assert idle.load is not None and idle.load.running is not None
        assert busy.load is not None and busy.load.running is not None
        assert busy.load.running + (busy.load.waiting or 0) >= 1
    else:
        assert idle.load is None  # Ollama and TabbyAPI report nothing: the gateway counts for them


# -- cases only an emulator can stage, for each of the six engines ------------------------------------

ENGINES = ["llama-server", "vllm", "sglang", "ollama", "tabbyapi", "lmdeploy"]
#: the engines of issue 39 emulated from their sources (MLC LLM and Dynamo cut a failing stream)
FAMILY = ["aphrodite", "trtllm", "tgi", "mlc", "lmstudio", "dynamo"]
CUT = {"mlc", "dynamo"}


def test_readiness_while_each_engine_loads(tmp_path) -> None:
    """Six emulators load, the way each engine does it, until the test releases them (a slow machine
    cannot outlast the loading phase); one gateway probes all six."""
    from contextlib import ExitStack

    from llm_gateway_emulators import EmulatorConfig, EmulatorThread

    load_s = 3600.0  # held: `finish_loading()` ends it
    with ExitStack() as stack:
        emus = {
            e: stack.enter_context(
                EmulatorThread(EmulatorConfig(engine=e, model="tiny", api_key=None, load_delay_s=load_s))
            )
            for e in ENGINES
        }
        backends = "\n".join(
            f'  - {{name: {e}, engine: {e}, url: "{emu.url}", probe: {{interval_s: 0.3}}}}' for e, emu in emus.items()
        )
        models = "\n".join(
            f"  - {{name: m-{e}, deployments: [{{backend: {e}, model: tiny, format: {FORMATS[e]}}}]}}" for e in ENGINES
        )
        cfg = f"server: {{access_log: false}}\nauth: {{mode: none}}\nbackends:\n{backends}\nmodels:\n{models}\n"
        gw = stack.enter_context(GatewayProcess(cfg, tmp_path, wait_ready=False))

        def states() -> dict[str, str]:
            return {k: v["state"] for k, v in httpx.get(gw.url + "/readyz").json()["backends"].items()}

        assert poll(lambda: "unknown" not in states().values(), 60), states()
        while_loading = states()
        loading = {e: chat(gw, f"m-{e}") for e in ENGINES if e != "ollama"}
        not_ready = httpx.get(gw.url + "/readyz")
        for emu in emus.values():
            emu.finish_loading()
        assert poll(lambda: set(states().values()) == {"ready"}, 60, 0.1), states()
        ready = {e: chat(gw, f"m-{e}") for e in ENGINES}
    # every engine but Ollama has a loading state the gateway sees; Ollama loads lazily on the first request
    assert while_loading == {
        "llama-server": "loading",
        "vllm": "down",
        "sglang": "loading",
        "ollama": "ready",
        "tabbyapi": "loading",
        "lmdeploy": "loading",
    }, while_loading
    for e, r in loading.items():
        err = assert_envelope(r, 503)
        assert err["code"] == "no_healthy_backend" and e in err["message"], (e, err)
    assert not_ready.status_code == 200  # Ollama counts as ready: readiness needs one usable backend
    assert {e: r.status_code for e, r in ready.items()} == dict.fromkeys(ENGINES, 200)


@pytest.mark.parametrize("engine", ENGINES + FAMILY)
def test_mid_stream_engine_error_is_one_error_event_then_the_end(engine: str, tmp_path) -> None:
    from llm_gateway_emulators import EmulatorConfig, EmulatorThread

    with EmulatorThread(
        EmulatorConfig(
            engine=engine,
            model="tiny",
            fault="mid_stream_error",
            fault_after_chunks=2,
            ping_interval_s=0.01,
            tpot_ms=20,
        )
    ) as emu:
        cfg = CONFIG.format(engine=engine, url=emu.url, key="", model="tiny", fmt=FORMATS[engine])
        with GatewayProcess(cfg, tmp_path) as gw:
            ev = stream_events(gw)
    errors = [orjson.loads(e)["error"] for e in ev if e.startswith('{"error"')]
    assert len(errors) == 1 and set(errors[0]) == {"message", "type", "param", "code"}
    if engine in CUT:  # no error event of the engine's: the gateway says the stream was cut
        assert "ended before the answer was complete" in errors[0]["message"], errors[0]
    else:
        assert "good" in errors[0]["message"]
    assert ev[-1] == "[DONE]" and ev[-2].startswith('{"error"')
    content = [e for e in ev[:-2]]
    assert all(orjson.loads(e).get("choices") is not None for e in content)  # pings and CRLF never leak


def test_readiness_while_each_family_engine_loads(tmp_path) -> None:
    """The engines of issue 39 while they load, one gateway probing all six: Aphrodite (as vLLM), trtllm-serve,
    TGI and MLC LLM open their port only once the model is in (down until then); Dynamo's frontend is live at
    once but serves the model only when its worker registers it (the deployment is out until then); LM Studio
    loads on demand and is always ready."""
    from contextlib import ExitStack

    from llm_gateway_emulators import EmulatorConfig, EmulatorThread

    with ExitStack() as stack:
        emus = {
            e: stack.enter_context(
                EmulatorThread(EmulatorConfig(engine=e, model="tiny", api_key=None, load_delay_s=3600.0))
            )
            for e in FAMILY
        }
        backends = "\n".join(
            f'  - {{name: {e}, engine: {e}, url: "{emu.url}", probe: {{interval_s: 0.3}}}}' for e, emu in emus.items()
        )
        models = "\n".join(
            f"  - {{name: m-{e}, deployments: [{{backend: {e}, model: tiny, format: {FORMATS[e]}}}]}}" for e in FAMILY
        )
        cfg = f"server: {{access_log: false}}\nauth: {{mode: none}}\nbackends:\n{backends}\nmodels:\n{models}\n"
        gw = stack.enter_context(GatewayProcess(cfg, tmp_path, wait_ready=False))

        def states() -> dict[str, str]:
            return {k: v["state"] for k, v in httpx.get(gw.url + "/readyz").json()["backends"].items()}

        assert poll(lambda: "unknown" not in states().values(), 60), states()
        while_loading = states()
        loading = {e: chat(gw, f"m-{e}") for e in FAMILY if e != "lmstudio"}
        for emu in emus.values():
            emu.finish_loading()
        assert poll(lambda: set(states().values()) == {"ready"}, 60, 0.1), states()
        assert poll(lambda: chat(gw, "m-dynamo").status_code == 200, 30, 0.2)  # its model is listed again
        ready = {e: chat(gw, f"m-{e}") for e in FAMILY}
    assert while_loading == {
        "aphrodite": "down",
        "trtllm": "down",
        "tgi": "down",
        "mlc": "down",
        "lmstudio": "ready",
        "dynamo": "ready",
    }, while_loading
    for e, r in loading.items():
        err = assert_envelope(r, 503)
        assert err["code"] == "no_healthy_backend" and e in err["message"], (e, err)
    assert "does not list model 'tiny'" in loading["dynamo"].json()["error"]["message"]
    assert {e: r.status_code for e, r in ready.items()} == dict.fromkeys(FAMILY, 200)
