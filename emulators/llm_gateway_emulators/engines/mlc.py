"""MLC LLM's server (`mlc_llm serve`), from mlc-ai/mlc-llm's source (its PyPI wheels are placeholders here).

Read at @01ced331a9e155c5ba4e7625b027a51bee611450: `python/mlc_llm/protocol/error_protocol.py`,
`python/mlc_llm/protocol/openai_api_protocol.py`, `python/mlc_llm/serve/entrypoints/openai_entrypoints.py`:

- FastAPI on uvicorn; the server starts once its engine is built (`listen_after_load`). No health
  route (Starlette's 404), no auth.
- `create_error_response` returns `JSONResponse(ErrorResponse(...).model_dump_json())`: the body is
  the error serialised twice, a JSON string holding `{"object":"error","message","code"}`.
- A model it does not serve: 400 `The requested model "<m>" is not served.`
- `stream_options` without `stream: true` fails the request model's validator (FastAPI's 422
  `{"detail": [...]}`); `best_of` other than 1 is refused (`openai_api_get_unsupported_fields`).
- `/v1/models` cards are `ModelResponse{id, created, object, owned_by: "MLC-LLM"}`.
- A stream's generator that fails ends the response (Starlette's StreamingResponse): the stream is
  cut with no error event and no `[DONE]`.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway_emulators.engines.fastapi_base import Problem
from llm_gateway_emulators.engines.openai_family import OpenAIFamily
from llm_gateway_emulators.jobs import Reply


class Mlc(OpenAIFamily):
    name = "mlc"
    owned_by = "MLC-LLM"
    listen_after_load = True
    health_paths = ()
    keyed_paths = frozenset()

    def err(self, status: int, message: str) -> Reply:
        inner = orjson.dumps({"object": "error", "message": message, "code": status}).decode()
        return self.uv_json(status, orjson.dumps(inner))  # model_dump_json() handed to JSONResponse

    def refuse_model(self, model: Any) -> Reply:
        return self.err(400, f'The requested model "{model}" is not served.')

    def check(self, body: dict[str, Any], chat: bool) -> Reply | None:
        if chat and body.get("stream_options") is not None and not body.get("stream"):
            msg = "Value error, stream must be set to True when stream_options is present"
            p = Problem("value_error", ("body",), msg, body)
            return self.uv_json(422, {"detail": [p.as_dict(list(p.loc))]})
        if body.get("best_of", 1) != 1:
            return self.err(400, 'Request fields "best_of" are not supported right now.')
        return None

    def stream_error(self) -> bytes:
        return b""  # the generator raised: the body just ends
