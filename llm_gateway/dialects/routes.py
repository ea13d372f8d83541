"""The route table of the data plane: which handler of which dialect serves each (method, path), and the
error envelope of the paths that speak another API than OpenAI's. The HTTP server (`http/asgi.py`)
dispatches by it and knows no route by name.
"""

from __future__ import annotations

from llm_gateway.dialects import audio, batches, files, ops, scoring, tokenize
from llm_gateway.dialects import openai as chat
from llm_gateway.dialects.anthropic import exchange as messages
from llm_gateway.dialects.responses import exchange as responses
from llm_gateway.http.asgi import Handler, PrefixRoute, Routes
from llm_gateway.wire.anthropic import error_answer

MODEL_PREFIXES = ("/v1/models/", "/models/")


def _exact() -> dict[tuple[str, str], Handler]:
    r: dict[tuple[str, str], Handler] = {}
    for prefix in ("/v1", ""):
        r[("POST", prefix + "/chat/completions")] = chat.chat
        r[("POST", prefix + "/completions")] = chat.completions
        r[("POST", prefix + "/embeddings")] = chat.embeddings
        r[("GET", prefix + "/models")] = chat.list_models
        r[("POST", prefix + "/responses")] = responses.create
        r[("POST", prefix + "/files")] = files.upload
        r[("GET", prefix + "/files")] = files.list_files
        r[("POST", prefix + "/batches")] = batches.create
        r[("GET", prefix + "/batches")] = batches.list_batches
        r[("POST", prefix + "/audio/transcriptions")] = audio.transcriptions
        r[("POST", prefix + "/audio/translations")] = audio.translations
    r[("POST", "/tokenize")] = tokenize.tokenize  # vLLM's and llama-server's paths: no /v1
    r[("POST", "/detokenize")] = tokenize.detokenize
    for path in scoring.RERANK_PATHS:  # vLLM's paths (llama-server's /v1/rerank among them)
        r[("POST", path)] = scoring.rerank
    for path in scoring.SCORE_PATHS:
        r[("POST", path)] = scoring.score
    r[("GET", "/healthz")] = ops.healthz
    r[("GET", "/readyz")] = ops.readyz
    r[("GET", "/metrics")] = ops.metrics
    r[("GET", "/openapi.json")] = ops.openapi
    r[("POST", "/v1/responses/input_tokens")] = responses.input_tokens
    r[("POST", "/v1/messages")] = messages.messages
    r[("POST", "/v1/messages/count_tokens")] = messages.count_tokens
    return r


ROUTES = Routes(
    exact=_exact(),
    prefixed=(
        PrefixRoute(MODEL_PREFIXES, {"GET": chat.get_model}),
        # /v1/responses/{id}/input_items serves GET only; /v1/responses/{id} GET and DELETE
        PrefixRoute(responses.PREFIXES, {"GET": responses.retrieve}, suffix="/input_items"),
        PrefixRoute(responses.PREFIXES, {"GET": responses.retrieve, "DELETE": responses.delete}),
        # /v1/files/{id}/content GET; /v1/files/{id} GET and DELETE; /v1/batches/{id}/cancel POST; /v1/batches/{id}
        PrefixRoute(files.FILE_PREFIXES, {"GET": files.retrieve}, suffix="/content"),
        PrefixRoute(files.FILE_PREFIXES, {"GET": files.retrieve, "DELETE": files.delete}),
        PrefixRoute(batches.BATCH_PREFIXES, {"POST": batches.cancel}, suffix="/cancel"),
        PrefixRoute(batches.BATCH_PREFIXES, {"GET": batches.retrieve}),
    ),
    renderers={"/v1/messages": error_answer, "/v1/messages/count_tokens": error_answer},
)
