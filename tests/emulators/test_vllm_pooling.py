"""The vLLM emulator's rerank, score and speech routes (engines/vllm_pooling.py): served only when the emulated
model serves them (vLLM registers them per model), in vLLM 0.32's shapes: a rerank sorted by score and cut to
`top_n`, a score broadcasting one query over the documents, a served-name check, a transcription from a form."""

from __future__ import annotations

import httpx

from tests.emulators.emu_helpers import keys, request, running

ENGINE = "vllm"
DOCS = ["a bear", "hello", "the giant panda"]


async def test_routes_exist_only_for_a_model_that_serves_them() -> None:
    async with running(ENGINE) as emu:
        for path in ("/rerank", "/score", "/v1/audio/transcriptions"):
            assert (await request(emu.url, "POST", path, {"model": "tiny"})).status == 404, path


async def test_rerank_and_score_shapes() -> None:
    async with running(ENGINE, scoring=True) as emu:
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            got = await request(emu.url, "POST", path, {"model": "tiny", "query": "panda", "documents": DOCS})
            assert got.status == 200, path
            body = got.json()
            assert keys(body) == ["id", "model", "usage", "results"]
            scores = [r["relevance_score"] for r in body["results"]]
            assert scores == sorted(scores, reverse=True) and len(scores) == 3
            assert all(r["document"]["text"] == DOCS[r["index"]] for r in body["results"])
        top = await request(
            emu.url, "POST", "/rerank", {"model": "tiny", "query": "panda", "documents": DOCS, "top_n": 1}
        )
        assert [r["index"] for r in top.json()["results"]] == [body["results"][0]["index"]]
        score = await request(emu.url, "POST", "/score", {"model": "tiny", "text_1": "panda", "text_2": DOCS})
        data = score.json()["data"]
        assert [d["index"] for d in data] == [0, 1, 2] and {d["object"] for d in data} == {"score"}
        assert {d["index"]: d["score"] for d in data} == {r["index"]: r["relevance_score"] for r in body["results"]}
        wrong = await request(emu.url, "POST", "/rerank", {"model": "other", "query": "q", "documents": DOCS})
        assert (wrong.status, wrong.json()["error"]["type"]) == (404, "NotFoundError")


async def test_a_transcription_from_a_form() -> None:
    async with running(ENGINE, speech=True) as emu, httpx.AsyncClient() as client:
        files = {"file": ("a.wav", bytes(range(256)) * 200, "audio/wav")}
        r = await client.post(emu.url + "/v1/audio/transcriptions", data={"model": "tiny"}, files=files)
        assert r.status_code == 200 and r.json()["text"] and r.json()["usage"]["type"] == "duration"
        r = await client.post(emu.url + "/v1/audio/translations", data={"model": "tiny"}, files=files)
        assert list(r.json()) == ["text"]
