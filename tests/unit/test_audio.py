"""`/v1/audio/transcriptions` and `/v1/audio/translations` through the gateway (the engine played by a
FakeUpstream): the `openai` SDK's multipart form reaches vLLM as it came but for its `model` field (the engine's
name spliced in), a form past `server.max_audio_bytes` is a 413 in OpenAI's envelope before any engine is asked,
bad forms are 400s, and only vLLM may have the `audio` capability."""

from __future__ import annotations

import httpx
import openai
import pytest

from llm_gateway.app import create_app
from llm_gateway.settings.loader import ConfigError
from tests.conftest import TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

CONFIG = """
server: {access_log: false, max_audio_bytes: 4096}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
backends:
  - {name: v, engine: vllm, url: "http://vllm.test"}
models:
  - name: whisper
    deployments: [{backend: v, model: openai/whisper-tiny, format: safetensors, capabilities: [audio]}]
  - name: chat-only
    deployments: [{backend: v, model: up-c, format: safetensors}]
"""
AUDIO = bytes(range(256)) * 4  # 1 KiB, every byte value (the form is passed on as bytes)
HEARD = {"text": "hello there", "usage": {"type": "duration", "seconds": 1}}


def form(model: str = "whisper", audio: bytes = AUDIO, **fields: str) -> tuple[bytes, str]:
    req = httpx.Request(
        "POST", "http://x/", data={"model": model, **fields}, files={"file": ("a.wav", audio, "audio/wav")}
    )
    return req.read(), req.headers["content-type"]


@pytest.mark.parametrize("task", ["transcriptions", "translations"])
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK marks `audio.translations` deprecated
async def test_the_sdk_form_reaches_vllm_with_the_engines_model_name(task: str) -> None:
    up = FakeUpstream({("POST", f"http://vllm.test/v1/audio/{task}"): FakeAnswer.json(HEARD)})
    app = create_app(make_config(CONFIG), upstream=up, probes=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as http:
        client = openai.AsyncOpenAI(base_url="http://gw.test/v1", api_key=TEST_KEY, http_client=http)
        create = client.audio.transcriptions.create if task == "transcriptions" else client.audio.translations.create
        got = await create(model="whisper", file=("a.wav", AUDIO, "audio/wav"))
    await app.shutdown()
    assert got.text == "hello there"
    sent = up.calls[0]
    assert sent.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert sent.body is not None and AUDIO in sent.body  # the audio as it came, byte for byte
    assert b"openai/whisper-tiny" in sent.body and b"\r\n\r\nwhisper\r\n" not in sent.body


async def test_the_form_is_passed_on_unchanged_but_for_the_model() -> None:
    body, ctype = form(language="en", response_format="json")
    up = FakeUpstream({("POST", "http://vllm.test/v1/audio/transcriptions"): FakeAnswer.json(HEARD)})
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, _):
        r = await client.post("/audio/transcriptions", content=body, headers={"content-type": ctype})
    assert (r.status_code, r.json()) == (200, HEARD)
    assert up.calls[0].body == body.replace(b"\r\n\r\nwhisper\r\n", b"\r\n\r\nopenai/whisper-tiny\r\n")


async def test_a_form_past_the_limit_is_a_413_before_any_engine() -> None:
    up = FakeUpstream()
    body, ctype = form(audio=b"\0" * 5000)
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, _):
        r = await client.post("/v1/audio/transcriptions", content=body, headers={"content-type": ctype})
        assert r.status_code == 413
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}

        async def chunks():  # no Content-Length: the limit holds while the body arrives
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]

        r = await client.post("/v1/audio/transcriptions", content=chunks(), headers={"content-type": ctype})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert up.calls == []


async def test_bad_forms_are_refused_in_openais_envelope() -> None:
    up = FakeUpstream()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, _):
        r = await client.post("/v1/audio/transcriptions", json={"model": "whisper"})
        assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
        body, ctype = form(model="nope")
        r = await client.post("/v1/audio/transcriptions", content=body, headers={"content-type": ctype})
        assert r.status_code == 404
        body, ctype = form(model="chat-only")
        r = await client.post("/v1/audio/transcriptions", content=body, headers={"content-type": ctype})
        assert r.status_code == 400 and r.json()["error"]["code"] == "capability_unavailable"
        body, ctype = form(stream="true")
        r = await client.post("/v1/audio/transcriptions", content=body, headers={"content-type": ctype})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
        req = httpx.Request("POST", "http://x/", data={"model": "whisper"}, files={"other": ("a", b"x")})
        r = await client.post("/v1/audio/translations", content=req.read(), headers=dict(req.headers))
        assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    assert up.calls == []


@pytest.mark.parametrize("engine", ["llama-server", "ollama"])
def test_only_vllm_may_have_the_audio_capability(engine: str) -> None:
    text = f"""
    backends: [{{name: e, engine: {engine}, url: "http://e.test"}}]
    models:
      - name: m
        deployments: [{{backend: e, model: x, format: gguf, capabilities: [audio]}}]
    """
    with pytest.raises(ConfigError, match="cannot serve audio"):
        make_config(text)
