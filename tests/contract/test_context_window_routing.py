"""Two deployments of one model with different windows, on two real llama-server processes (`-c 1024`
and `-c 4096`, one slot each, the tiny GGUF) behind the gateway as a process, round robin:

- a short prompt lands on either (both used);
- a long prompt (fits only the larger window) lands on the larger one every time, never reaching the
  small one. The tiny GGUF's tokenizer spends a token a byte (its word pieces go unused: 23 tokens of
  template beside them), so every such prompt is in the ambiguous zone (its lower bound, a token per
  8 bytes, fits 1,024, its real count does not): it is the engine's count (routing/prompt_count.py) that routes
  it. The floor alone routing a prompt is covered by tests/unit/test_context_windows.py;
- an over-long prompt is a 400 `context_length_exceeded` naming the window and the engine's count (or,
  when even the lower bound is over, the estimate), and neither engine processes a prompt token.

The same beside the suite's real vLLM (`vllm_server`, 32,768 tokens; reused, not a second one) in one
model with the 1,024 llama-server: long prompts go to vLLM, an over-long one (counted by vLLM's
/tokenize) reaches neither. Ollama reports no window to routing (its adapter guards its `num_ctx`
itself: tests/contract/test_ollama_truth.py), so it has no pairing here.

The engines' own counters (`llamacpp:prompt_tokens_total`) say where prompts were processed; the
prompts' real sizes are measured on the engine (/apply-template + /tokenize) so the zones are checked,
not assumed."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import LLAMA_KEY, require
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import EngineNotInstalled, LlamaServer, RealEngine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real_engine

SMALL, LARGE = 1024, 4096
CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: small, engine: llama-server, url: "{small}", api_key: "{key}", probe: {{interval_s: 0.5}}}}
  - {{name: large, engine: llama-server, url: "{large}", api_key: "{key}", probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    strategy: round_robin
    deployments:
      - {{backend: small, model: tiny-llama, format: gguf}}
      - {{backend: large, model: tiny-llama, format: gguf}}
"""


def messages(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


SHORT = messages("hello world")
LONG = (messages("the " * 500), messages("x" * 3000))  # 2,023 and 3,023 tokens; floors 187 and 375
OVER_BY_COUNT = messages("the " * 1500)  # floor 562 fits 4,096; 6,023 tokens do not
OVER_BY_FLOOR = messages("x" * 40_000)  # floor 5,000 > 4,096: refused without counting


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LlamaServer]]:
    started: dict[str, LlamaServer] = {}
    try:
        for name, ctx in (("small", SMALL), ("large", LARGE)):
            eng = LlamaServer(
                parallel=1, threads=1, ctx_size=ctx, api_key=LLAMA_KEY, workdir=tmp_path_factory.mktemp(f"llama-{name}")
            )
            started[name] = eng
            eng.start()
    except EngineNotInstalled as e:
        require(f"engine not installed: {e}")
        raise
    try:
        yield started
    finally:
        for eng in started.values():
            eng.stop()


@pytest.fixture(scope="module")
def gw(engines: dict[str, LlamaServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(small=engines["small"].url, large=engines["large"].url, key=LLAMA_KEY)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-ctx-routing")) as g:
        wait_until(lambda: _windows_known(g), timeout=60, what="the gateway probed both windows")
        yield g


def _windows_known(gw: GatewayProcess) -> bool:
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    return all(
        f'backend="{b}",model="tiny",upstream_model="tiny-llama"}} {w}.0' in text
        for b, w in (("small", SMALL), ("large", LARGE))
    )


def engine_count(eng: LlamaServer, msgs: list[dict[str, str]]) -> int:
    """The prompt's tokens on the engine itself, as a generation would process them."""
    prompt = httpx.post(eng.url + "/apply-template", headers=eng.headers, json={"messages": msgs}, timeout=30)
    req = {"content": prompt.json()["prompt"], "add_special": True, "parse_special": True}
    tokens = httpx.post(eng.url + "/tokenize", headers=eng.headers, json=req, timeout=30).json()["tokens"]
    return len(tokens)


def prompt_tokens_processed(eng: LlamaServer) -> float:
    for line in httpx.get(eng.url + "/metrics", headers=eng.headers, timeout=10).text.splitlines():
        if line.startswith("llamacpp:prompt_tokens_total"):
            return float(line.split()[-1])
    raise AssertionError("llama-server /metrics has no llamacpp:prompt_tokens_total")


def gateway_counts(gw: GatewayProcess) -> dict[str, float]:
    found = dict.fromkeys(("counted", "cached", "failed"), 0.0)
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("gateway_prompt_counts_total{"):
            found[line.split('result="')[1].split('"')[0]] = float(line.split()[-1])
    return found


def ask(gw: GatewayProcess, msgs: list[dict[str, str]]) -> httpx.Response:
    body = {"model": "tiny", "messages": msgs, "max_tokens": 2}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=120)


def test_the_prompts_sizes_on_the_real_tokenizer_are_what_the_test_says(engines: dict[str, LlamaServer]) -> None:
    small = engines["small"]
    assert all(SMALL < engine_count(small, msgs) < LARGE for msgs in LONG)
    assert engine_count(small, OVER_BY_COUNT) > LARGE
    assert engine_count(small, SHORT) < 64


def test_short_prompts_use_both_and_long_ones_only_the_larger_window(
    gw: GatewayProcess, engines: dict[str, LlamaServer]
) -> None:
    landed = [ask(gw, SHORT).headers["x-gateway-backend"] for _ in range(4)]
    assert set(landed) == {"small", "large"}, landed

    before = {n: prompt_tokens_processed(e) for n, e in engines.items()}
    counted = gateway_counts(gw)
    for msgs in (*LONG, *LONG):  # round robin would give the small one every other turn
        r = ask(gw, msgs)
        assert (r.status_code, r.headers["x-gateway-backend"]) == (200, "large"), r.text
        assert r.json()["usage"]["prompt_tokens"] > SMALL
    after = {n: prompt_tokens_processed(e) for n, e in engines.items()}
    assert after["small"] == before["small"]  # the small engine processed none of them
    assert after["large"] > before["large"] + 2 * SMALL
    now = gateway_counts(gw)  # each prompt counted once by an engine, then remembered
    assert (now["counted"] - counted["counted"], now["cached"] - counted["cached"]) == (2, 2)


@pytest.mark.parametrize(("msgs", "exact"), [(OVER_BY_COUNT, True), (OVER_BY_FLOOR, False)], ids=["count", "floor"])
def test_an_over_long_prompt_is_refused_without_reaching_either_engine(
    gw: GatewayProcess, engines: dict[str, LlamaServer], msgs: list[dict[str, str]], exact: bool
) -> None:
    before = {n: prompt_tokens_processed(e) for n, e in engines.items()}
    counted = gateway_counts(gw)["counted"]
    r = ask(gw, msgs)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and f"{LARGE} tokens" in err["message"]
    if exact:  # the engine's own count is named
        n = engine_count(engines["large"], msgs)
        assert f"needs {n} tokens" in err["message"] and "engine's own tokenizer" in err["message"]
    else:
        assert "at least" in err["message"] and "gateway's estimate" in err["message"]
    assert "x-gateway-backend" not in r.headers
    assert gateway_counts(gw)["counted"] == counted + (1 if exact else 0)
    assert {n: prompt_tokens_processed(e) for n, e in engines.items()} == before


# -- the same with the real vLLM (the suite's: 32,768 tokens) beside the 1,024 llama-server ---------------

MIXED = """
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: small, engine: llama-server, url: "{small}", api_key: "{llama_key}", probe: {{interval_s: 0.5}}}}
  - {{name: vllm, engine: vllm, url: "{vllm}", api_key: "{vllm_key}", probe: {{interval_s: 0.5}}}}
models:
  - name: mixed
    strategy: round_robin
    deployments:
      - {{backend: small, model: tiny-llama, format: gguf}}
      - {{backend: vllm, model: "{vllm_model}", format: safetensors}}
"""
#: the vLLM tiny model's tokenizer is a character a token too: floor 5,000 fits 32,768, ~40,000 tokens do not
OVER_VLLM = messages("x" * 40_000)


def vllm_prompt_tokens(eng: RealEngine) -> float:
    text = httpx.get(eng.url + "/metrics", headers=eng.headers, timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens_total"))


@pytest.fixture(scope="module")
def mixed(
    engines: dict[str, LlamaServer], vllm_server: RealEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    cfg = MIXED.format(
        small=engines["small"].url,
        llama_key=LLAMA_KEY,
        vllm=vllm_server.url,
        vllm_key=vllm_server.api_key,
        vllm_model=vllm_server.model,
    )
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-ctx-mixed")) as g:
        wait_until(
            lambda: (
                'backend="vllm",model="mixed"'
                in httpx.get(g.url + "/metrics", timeout=5).text.split("gateway_deployment_context_length")[-1]
            ),
            timeout=120,
            what="the gateway probed vLLM's window",
        )
        yield g


def test_beside_vllm_a_long_prompt_goes_to_vllm_and_an_over_long_one_reaches_neither(
    mixed: GatewayProcess, engines: dict[str, LlamaServer], vllm_server: RealEngine
) -> None:
    small = engines["small"]

    def ask_mixed(msgs: list[dict[str, str]]) -> httpx.Response:
        body = {"model": "mixed", "messages": msgs, "max_tokens": 2}
        return httpx.post(mixed.url + "/v1/chat/completions", json=body, timeout=300)

    landed = [ask_mixed(SHORT).headers["x-gateway-backend"] for _ in range(4)]
    assert set(landed) == {"small", "vllm"}, landed
    before = prompt_tokens_processed(small)
    for msgs in LONG:  # counted on the small window's engine (its tokenizer is the one in question)
        r = ask_mixed(msgs)
        assert (r.status_code, r.headers["x-gateway-backend"]) == (200, "vllm"), r.text
    assert prompt_tokens_processed(small) == before

    held = (prompt_tokens_processed(small), vllm_prompt_tokens(vllm_server))
    r = ask_mixed(OVER_VLLM)  # ambiguous for vLLM only: counted by its /tokenize, over 32,768
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "32768 tokens" in err["message"]
    assert "engine's own tokenizer" in err["message"]
    assert (prompt_tokens_processed(small), vllm_prompt_tokens(vllm_server)) == held
