"""Rerank, score and speech to text through the gateway (in process, its real upstream client) to the vLLM
emulator (engines/vllm_pooling.py, vLLM 0.32's routes and shapes): the ranking is the engine's, the answers name
the public model, the `openai` SDK's transcription form goes through, and the metrics count each endpoint."""

from __future__ import annotations

import httpx
import openai

from llm_gateway.app import create_app
from llm_gateway_emulators import Emulator, EmulatorConfig
from tests.conftest import TEST_KEY, make_config

CONFIG = """
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}"}}
backends:
  - {{name: v, engine: vllm, url: "{url}"}}
models:
  - name: ranker
    deployments: [{{backend: v, model: tiny, format: safetensors, capabilities: [rerank, score, audio]}}]
"""
DOCS = ["the giant panda is a bear", "hello world", "llamas live in the Andes"]


async def test_rerank_score_and_audio_through_the_gateway_to_the_emulator() -> None:
    async with Emulator(EmulatorConfig(engine="vllm", model="tiny", scoring=True, speech=True), port=0) as emu:
        app = create_app(make_config(CONFIG.format(url=emu.url)), probes=False)
        transport = httpx.ASGITransport(app=app)
        auth = {"authorization": f"Bearer {TEST_KEY}"}
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test", headers=auth) as http:
                async with httpx.AsyncClient() as direct:
                    asked = {"model": "tiny", "query": "panda", "documents": DOCS}
                    own = (await direct.post(emu.url + "/rerank", json=asked)).json()
                r = await http.post("/v1/rerank", json={"model": "ranker", "query": "panda", "documents": DOCS})
                assert r.status_code == 200, r.text
                got = r.json()
                assert got["model"] == "ranker"
                assert [x["index"] for x in got["results"]] == [x["index"] for x in own["results"]]
                assert [x["relevance_score"] for x in got["results"]] == [x["relevance_score"] for x in own["results"]]
                top = await http.post(
                    "/v2/rerank", json={"model": "ranker", "query": "panda", "documents": DOCS, "top_n": 1}
                )
                assert [x["index"] for x in top.json()["results"]] == [own["results"][0]["index"]]

                r = await http.post("/score", json={"model": "ranker", "queries": "panda", "documents": DOCS})
                assert r.status_code == 200, r.text
                scores = {x["index"]: x["score"] for x in r.json()["data"]}
                assert scores == {x["index"]: x["relevance_score"] for x in own["results"]}

                client = openai.AsyncOpenAI(base_url="http://gw.test/v1", api_key=TEST_KEY, http_client=http)
                heard = await client.audio.transcriptions.create(
                    model="ranker", file=("a.wav", bytes(range(256)) * 256, "audio/wav")
                )
                assert heard.text  # the emulator's words for the audio

                text = (await http.get("/metrics")).text
                for endpoint in ("rerank", "score", "transcriptions"):
                    assert f'endpoint="{endpoint}"' in text, endpoint
        finally:
            await app.gw.aclose()
