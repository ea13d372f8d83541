"""OpenAI's speech to text on the gateway: `POST /v1/audio/transcriptions` and `POST /v1/audio/translations` (also
without `/v1`), multipart/form-data as the `openai` SDK sends them (`file`, `model`, `language`, `prompt`,
`response_format`, `temperature`), to a deployment with the `audio` capability (adapters/audio.py).

The form is read up to `server.max_audio_bytes` (a Content-Length past it, or a body that grows past it, is a 413
in OpenAI's envelope before more is read) and goes to the engine as it came, but for its `model` field, spliced to
the engine's name: one copy of the form, never re-encoded. `stream` is refused (the answer is relayed whole).
Keys, limits, routing and metrics are service/engine_call.py's, as endpoint `transcriptions` or `translations`.
"""

from __future__ import annotations

from llm_gateway.adapters import audio as engine_audio
from llm_gateway.dialects import multipart
from llm_gateway.dialects.common import HandlerContext, authenticate
from llm_gateway.errors import InvalidRequest
from llm_gateway.http.call import Call
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.backend_calls import BackendPoster
from llm_gateway.routing.table import Deployment
from llm_gateway.service import engine_call
from llm_gateway.service.runtime import Runtime

FIELDS = "the fields 'file' and 'model'"


async def transcriptions(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await _speech(ctx, call, rec, rt, "transcriptions")


async def translations(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await _speech(ctx, call, rec, rt, "translations")


async def _speech(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime, task: engine_audio.Task) -> None:
    rec.endpoint = task
    who = authenticate(call, rec, rt)
    content_type = call.header(b"content-type")
    boundary = multipart.boundary_of(content_type, FIELDS)
    form = await call.read_body(ctx.server.max_audio_bytes, ctx.server.body_timeout_s)
    parts = multipart.parse(form, boundary)
    model = parts.get("model")

    def check() -> None:
        file = parts.get("file")
        if file is None or file.filename is None or not file.data:
            raise InvalidRequest("The form has no 'file' field with a filename and audio.", param="file")
        stream = parts.get("stream")
        if stream is not None and stream.data.strip().lower() == b"true":
            raise InvalidRequest("stream is not supported on this route; ask without it.", param="stream")

    async def ask(dep: Deployment, poster: BackendPoster) -> tuple[int, bytes]:
        assert model is not None  # engine_call resolved it
        sent = form[: model.start] + dep.upstream_model.encode() + form[model.end :]
        assert content_type is not None  # boundary_of found one
        return await engine_audio.speech_to_text(dep.backend.adapter, poster, task, sent, content_type.decode())

    name = model.data.decode("utf-8", "replace").strip() if model is not None else None
    await engine_call.serve(
        ctx.service.gw,
        call,
        rec,
        rt,
        "audio",
        name,
        who,
        ask,
        check=check,
        timeouts=engine_call.ENGINE_TIMEOUTS,
        answer_limit=engine_call.ANSWER_LIMIT,
    )
