"""vLLM's scoring and speech-to-text routes on the emulator (captured 0.32.0), beside engines/vllm.py.

Paths as vLLM registers them (vllm-project/vllm v0.32.0 `vllm/entrypoints/pooling/scoring/api_router.py`):
``/rerank``, ``/v1/rerank``, ``/v2/rerank`` (one handler) and ``/score``, ``/v1/score``; and
``/v1/audio/transcriptions``, ``/v1/audio/translations`` (`vllm/entrypoints/speech_to_text/*/api_router.py`,
a multipart ``Form()``). Shapes as its ``serving.py`` builds them: a rerank answers {id, model, usage, results},
each result {index, document: {text}, relevance_score}, sorted by score, cut to ``top_n`` when it is above 0; a
score answers {id, object: list, created, model, data: [{index, object: score, score}], usage}, one query broadcast
over the documents (or pairs of equal lists). Scores are the cosine of the emulator's text embeddings mapped to
[0, 1] (deterministic: the same pair, the same score). A transcription answers {text, usage: {type: duration,
seconds}}, a translation {text}: the text is derived from the audio's bytes. Each takes a slot like an embedding.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from llm_gateway_emulators import textgen
from llm_gateway_emulators.engines.vllm_stream import DEAD
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.vllm import Vllm

RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
SCORE_PATHS = ("/score", "/v1/score")
SCORE_FIELDS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))
_BOUNDARY = re.compile(r'boundary="?([^";,\s]+)"?', re.IGNORECASE)
_NAME = re.compile(rb'name="([^"]*)"')


def relevance(query: str, document: str) -> float:
    a, b = textgen.embedding(query), textgen.embedding(document)
    return (1.0 + sum(x * y for x, y in zip(a, b, strict=True))) / 2.0


def _texts(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    return [v if isinstance(v, str) else str(v) for v in items]


def _wrong_model(eng: Vllm, body: dict[str, Any]) -> Reply | None:
    model = body.get("model")
    if model is not None and model != eng.cfg.model:
        return eng.err(404, f"The model `{model}` does not exist. Valid aliases: {eng.cfg.model}.", param="model")
    return None


async def rerank(eng: Vllm, req: Request) -> None:
    body, prob = eng.body_problem(req, ("query", "documents"))
    if prob is not None:
        await eng.reply(req, eng.problem(prob))
        return
    assert body is not None
    wrong = _wrong_model(eng, body)
    if wrong is not None:
        await eng.reply(req, wrong)
        return
    query, docs = str(body["query"]), _texts(body["documents"])
    top_n = body.get("top_n") or 0
    tokens = sum(textgen.text_tokens(query) + textgen.text_tokens(d) for d in docs)

    def build(res: Result) -> Reply:
        scored = sorted(((relevance(query, d), i) for i, d in enumerate(docs)), key=lambda p: -p[0])
        results = [
            {"index": i, "document": {"text": docs[i], "multi_modal": None}, "relevance_score": s} for s, i in scored
        ]
        if isinstance(top_n, int) and 0 < top_n < len(docs):
            results = results[:top_n]
        obj = {
            "id": "rerank-" + textgen.rand_hex(32),
            "model": eng.cfg.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
        }
        return eng.uv_json(200, obj)

    await eng.generate(req, InferenceJob.embedding(tokens, build, lambda: eng.err(500, DEAD)))


async def score(eng: Vllm, req: Request) -> None:
    body, prob = eng.body_problem(req, ())
    if prob is not None:
        await eng.reply(req, eng.problem(prob))
        return
    assert body is not None
    pair = next(((a, b) for a, b in SCORE_FIELDS if a in body and b in body), None)
    if pair is None:
        await eng.reply(req, eng.err(400, "1 validation error: the score pairs are missing", param="body"))
        return
    wrong = _wrong_model(eng, body)
    if wrong is not None:
        await eng.reply(req, wrong)
        return
    left, right = _texts(body[pair[0]]), _texts(body[pair[1]])
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right):
        await eng.reply(req, eng.err(400, "Input lengths must be either 1:1, 1:N or N:N"))
        return
    tokens = sum(textgen.text_tokens(a) + textgen.text_tokens(b) for a, b in zip(left, right, strict=True))

    def build(res: Result) -> Reply:
        obj = {
            "id": "score-" + textgen.rand_hex(32),
            "object": "list",
            "created": eng.now(),
            "model": eng.cfg.model,
            "data": [
                {"index": i, "object": "score", "score": relevance(a, b)}
                for i, (a, b) in enumerate(zip(left, right, strict=True))
            ],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
        return eng.uv_json(200, obj)

    await eng.generate(req, InferenceJob.embedding(tokens, build, lambda: eng.err(500, DEAD)))


def form_fields(req: Request) -> dict[str, bytes] | None:
    """A multipart/form-data body's fields by name (None: not such a body)."""
    m = _BOUNDARY.search(req.headers.get("content-type", ""))
    if m is None:
        return None
    fields: dict[str, bytes] = {}
    for part in req.body.split(b"--" + m.group(1).encode())[1:]:
        head, sep, data = part.partition(b"\r\n\r\n")
        name = _NAME.search(head)
        if sep and name is not None:
            fields.setdefault(name.group(1).decode(), data[:-2] if data.endswith(b"\r\n") else data)
    return fields


async def speech(eng: Vllm, req: Request, task: Literal["transcriptions", "translations"]) -> None:
    fields = form_fields(req)
    if fields is None or "file" not in fields:
        await eng.reply(req, eng.err(400, "1 validation error: file Field required", param="file"))
        return
    model = fields.get("model")
    if model is not None and model.decode() != eng.cfg.model:
        await eng.reply(req, eng.err(404, f"The model `{model.decode()}` does not exist.", param="model"))
        return
    audio = fields["file"]
    seconds = max(1, len(audio) // 32000)  # 16 kHz, 16-bit mono
    words = max(1, seconds * 2)
    text = " ".join(textgen.token_text(int(b)).strip() for b in audio[:words]) if audio else ""

    def build(res: Result) -> Reply:
        if task == "translations":
            return eng.uv_json(200, {"text": text})
        return eng.uv_json(200, {"text": text, "usage": {"type": "duration", "seconds": seconds}})

    await eng.generate(req, InferenceJob.embedding(words, build, lambda: eng.err(500, DEAD)))
