"""Ollama engine truth end to end: the unmodified `openai` SDK -> the gateway as a real process -> the
real Ollama (0.5.4, bigdl-core-cpp's `ollama-lib`, the tiny model, num_ctx 4096) and the Ollama emulator
(its HEAD default, and 0.5.4 with `ollama_legacy`).

- A prompt far longer than the context window is a 400 `context_length_exceeded`, whole and streamed,
  as from llama-server and vLLM: the real 0.5.4 cuts it and answers 200 (it has no `truncate` for chat),
  so the gateway reads the cut from `prompt_eval_count`; HEAD refuses it itself on `truncate: false`.
  An ordinary prompt still gets its answer, and after one the model is resident (`/api/ps`), as the
  `gateway_deployment_resident` gauge and `/v1/models` say.
- `logprobs` come back in OpenAI's shape from HEAD (whole and streamed) and are a 400
  `unsupported_parameter` naming `logprobs` on 0.5.4, which returns none.
- A whole answer Ollama did not finish is a 502 `generation_failed`: the real Ollama aborts a generation
  after 30 identical tokens, which a repeat-prone build of the tiny model (`--anti-repeat 0`) at
  temperature 0 reaches within its first ~100 tokens (every prompt tried: see make_tiny_gguf.py), so the
  real `done: false` answer is shown here, and the emulator's `ollama_repeat_abort` fault shows the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionTokenLogprob

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import OllamaServer, RealEngine, tiny_gguf
from tests.support.waiting import wait_until

LONG = " ".join(f"word{i % 50}" for i in range(20000))  # ~140 KB: ~140,000 tokens of the tiny model
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
REPEAT_MODEL = "tiny-repeat"

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
backends:
{backends}
models:
{models}
"""


def config(backends: dict[str, str], models: dict[str, tuple[str, str]], windows: dict[str, int] | None = None) -> str:
    """`windows`: a public model's deployment `context_length` (Ollama reports none to routing)."""
    b = "\n".join(
        f'  - {{name: {n}, engine: ollama, url: "{u}", probe: {{interval_s: 0.5}}}}' for n, u in backends.items()
    )
    caps = "format: gguf, capabilities: [chat, completions]"
    win = windows or {}
    m = "\n".join(
        f"  - {{name: {n}, deployments: [{{backend: {be}, model: {mo}, {caps}"
        + (f", context_length: {win[n]}" if n in win else "")
        + "}]}"
        for n, (be, mo) in models.items()
    )
    return CONFIG.format(backends=b, models=m)


def wait_all_probed(gw: GatewayProcess) -> None:
    """Every backend probed ready: the adapters know their engine's version."""

    def ready() -> bool:
        body = httpx.get(gw.url + "/readyz", timeout=5).json()
        return all(b["state"] == "ready" for b in body["backends"].values())

    wait_until(ready, what="every Ollama backend probed ready")


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=120)


# -- the real Ollama ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_gw(ollama_server: RealEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    assert isinstance(ollama_server, OllamaServer) and ollama_server.binary is not None
    work = tmp_path_factory.mktemp("ollama-truth")
    ollama_server.create_model(REPEAT_MODEL, tiny_gguf("--anti-repeat", "0"), work / "Modelfile")
    models = {"tiny-public": ("ol", "tiny"), "repeat-public": ("ol", REPEAT_MODEL), "windowed-public": ("ol", "tiny")}
    cfg = config({"ol": ollama_server.url}, models, {"windowed-public": ollama_server.num_ctx})
    try:
        with GatewayProcess(cfg, work) as gw:
            wait_all_probed(gw)
            yield gw
    finally:
        ollama(ollama_server, "rm", REPEAT_MODEL)  # the session's Ollama serves its own model only again


def ollama(eng: OllamaServer, *args: str) -> None:
    res = eng.cli(*args)
    assert res.returncode == 0, f"ollama-lib {' '.join(args)} failed ({res.returncode}): {res.stderr[-2000:]}"


def test_real_ollama_long_prompt_is_context_length_exceeded_whole_and_streamed(real_gw: GatewayProcess) -> None:
    c = client(real_gw)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": LONG}]
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="tiny-public", messages=msgs, max_tokens=5, temperature=0)
    assert (ei.value.status_code, ei.value.code) == (400, "context_length_exceeded"), ei.value.body
    assert "4096" in ei.value.message  # the tokens Ollama kept: all its window (num_ctx)
    with pytest.raises(openai.APIError) as es:  # the 200 stream ends with the error event, no finish chunk
        for chunk in c.chat.completions.create(model="tiny-public", messages=msgs, max_tokens=5, stream=True):
            assert not chunk.choices or chunk.choices[0].finish_reason is None
    assert es.value.code == "context_length_exceeded", es.value.body
    with pytest.raises(openai.BadRequestError) as ec:
        c.completions.create(model="tiny-public", prompt=LONG, max_tokens=5)
    assert ec.value.code == "context_length_exceeded"


def test_real_ollama_with_its_window_configured_refuses_a_long_prompt_without_calling_it(
    real_gw: GatewayProcess, ollama_server: RealEngine
) -> None:
    # Ollama reports no window to routing (its num_ctx is a request option, the Modelfile's or an env
    # variable's); with the deployment's `context_length` set, the fit check refuses before any call
    assert isinstance(ollama_server, OllamaServer)
    c = client(real_gw)
    before = ollama_server.exchanges_logged("/api/chat")
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": LONG}]
    for stream in (False, True):  # a stream is refused before its 200: BadRequestError at create()
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model="windowed-public", messages=msgs, max_tokens=5, stream=stream)
        assert (ei.value.status_code, ei.value.code) == (400, "context_length_exceeded"), ei.value.body
        assert f"maximum context length is {ollama_server.num_ctx} tokens" in ei.value.message
    assert ollama_server.exchanges_logged("/api/chat") == before  # Ollama never saw them
    ok = c.chat.completions.create(model="windowed-public", messages=HI, max_tokens=2, temperature=0)
    assert ok.choices[0].message.content is not None
    wait_until(lambda: ollama_server.exchanges_logged("/api/chat") > before, what="Ollama's log of the short one")


def test_real_ollama_model_is_resident_after_a_request(real_gw: GatewayProcess) -> None:
    # after an answer the model stays loaded for keep_alive (5 min by default): the probes read it from
    # /api/ps. Whether it was cold before depends on earlier tests, so only the loaded side is shown.
    r = client(real_gw).chat.completions.create(model="tiny-public", messages=HI, max_tokens=2, temperature=0)
    assert r.choices[0].message.content is not None
    gauge = 'gateway_deployment_resident{backend="ol",model="tiny-public",upstream_model="tiny"} 1.0'
    wait_until(lambda: gauge in httpx.get(real_gw.url + "/metrics", timeout=5).text, what="the resident gauge at 1")
    card = httpx.get(real_gw.url + "/v1/models/tiny-public", timeout=5).json()
    assert card["resident"] is True and card["ready"] is True


def test_real_ollama_ordinary_prompt_still_answers(real_gw: GatewayProcess) -> None:
    c = client(real_gw)
    r = c.chat.completions.create(model="tiny-public", messages=HI, max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 5
    # ~3,000 tokens (the tiny model's vocabulary is about a character a token): fits the 4096 window
    medium: list[ChatCompletionMessageParam] = [{"role": "user", "content": LONG[:3000]}]
    r = c.chat.completions.create(model="tiny-public", messages=medium, max_tokens=5, temperature=0)
    assert r.usage is not None and 1000 < r.usage.prompt_tokens < 4096


def test_real_ollama_0_5_4_logprobs_are_a_400_naming_the_field(real_gw: GatewayProcess) -> None:
    c = client(real_gw)
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="tiny-public", messages=HI, max_tokens=5, logprobs=True, top_logprobs=2)
    assert (ei.value.code, ei.value.param) == ("unsupported_parameter", "logprobs"), ei.value.body
    with pytest.raises(openai.BadRequestError) as ec:
        c.completions.create(model="tiny-public", prompt="Hello", max_tokens=5, logprobs=2)
    assert ec.value.param == "logprobs"


def test_real_ollama_unfinished_whole_answer_is_a_502(real_gw: GatewayProcess) -> None:
    c = client(real_gw)
    with pytest.raises(openai.InternalServerError) as ei:
        c.chat.completions.create(model="repeat-public", messages=HI, max_tokens=300, temperature=0)
    assert (ei.value.status_code, ei.value.code) == (502, "generation_failed"), ei.value.body
    assert "done: false" in ei.value.message
    with pytest.raises(openai.APIError) as es:  # streamed, as before: the stream ends without done
        for _ in c.chat.completions.create(
            model="repeat-public", messages=HI, max_tokens=300, temperature=0, stream=True
        ):
            pass
    assert es.value.code == "stream_interrupted", es.value.body


# -- the emulator: HEAD and 0.5.4 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emu_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, EmulatorThread, EmulatorThread]]:
    with (
        EmulatorThread(EmulatorConfig(engine="ollama", model="tiny")) as head,
        EmulatorThread(EmulatorConfig(engine="ollama", model="tiny", ollama_legacy=True)) as old,
    ):
        cfg = config({"head": head.url, "old": old.url}, {"head": ("head", "tiny"), "old": ("old", "tiny")})
        with GatewayProcess(cfg, Path(tmp_path_factory.mktemp("ollama-truth-emu"))) as gw:
            wait_all_probed(gw)
            yield gw, head, old


def last_sent(emu: EmulatorThread) -> dict[str, Any]:
    last = emu.stats.last_request
    assert last is not None
    body: dict[str, Any] = last["json"]
    return body


def test_emulated_long_prompt_is_refused_by_head_and_caught_after_0_5_4(
    emu_gw: tuple[GatewayProcess, EmulatorThread, EmulatorThread],
) -> None:
    gw, head, old = emu_gw
    c = client(gw)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": LONG}]
    # HEAD refuses it itself (truncate: false); 0.5.4 cuts it, and the gateway reads the cut
    for model, emu, says in (("head", head, "exceeds the available context size"), ("old", old, "it cut the prompt")):
        with pytest.raises(openai.BadRequestError) as ei:
            c.chat.completions.create(model=model, messages=msgs, max_tokens=5)
        assert ei.value.code == "context_length_exceeded", (model, ei.value.body)
        assert says in ei.value.message, (model, ei.value.message)
        assert last_sent(emu)["truncate"] is False


def test_emulated_head_logprobs_come_back_in_openais_shape(
    emu_gw: tuple[GatewayProcess, EmulatorThread, EmulatorThread],
) -> None:
    gw, _, old = emu_gw
    c = client(gw)
    r = c.chat.completions.create(model="head", messages=HI, max_tokens=4, logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 4
    assert "".join(t.token for t in lp.content) == r.choices[0].message.content
    assert all(len(t.top_logprobs) == 2 and t.bytes == list(t.token.encode()) for t in lp.content)
    streamed: list[ChatCompletionTokenLogprob] = []
    for chunk in c.chat.completions.create(
        model="head",
        messages=HI,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed += chunk.choices[0].logprobs.content
    assert [t.token for t in streamed] == [t.token for t in lp.content]
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="old", messages=HI, max_tokens=4, logprobs=True)
    assert (ei.value.code, ei.value.param) == ("unsupported_parameter", "logprobs")
    assert old.stats.last_request is None or "logprobs" not in last_sent(old)  # refused before it was sent


def test_emulated_unfinished_whole_answer_is_a_502(
    emu_gw: tuple[GatewayProcess, EmulatorThread, EmulatorThread],
) -> None:
    gw, head, _ = emu_gw
    head.config.fault, head.config.fault_count = "ollama_repeat_abort", 1
    with pytest.raises(openai.InternalServerError) as ei:
        client(gw).chat.completions.create(model="head", messages=HI, max_tokens=20)
    assert (ei.value.status_code, ei.value.code) == (502, "generation_failed"), ei.value.body
