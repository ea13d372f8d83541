"""The shared behaviour of engines that speak OpenAI's HTTP API themselves.

llama-server, vLLM, SGLang, TabbyAPI, LMDeploy, Aphrodite, trtllm-serve, MLX-LM, MLC LLM, TGI,
Dynamo, LM Studio and any other OpenAI-compatible server (`kind: openai`: OpenVINO Model Server,
llama-swap) build on `OpenAICompatAdapter`; each overrides only what its engine does differently.
Request fields an engine spells differently are declared (`renames`) and renamed in one place;
`include_usage` is the one way the gateway asks an engine for usage. Each engine's `field_table` says
what becomes of every OpenAI request field (adapters/field_table.py); `build()` checks the body against
it first, so a field the engine would drop is a 400 before the engine is called. A finish reason in
`error_finish_reasons` (SGLang's, LMDeploy's and vLLM's `abort`/`error`) fails the generation: a whole
answer is a 502 `generation_failed` carrying what it spent (`spent_usage`), a stream ends with an error
event (`SSERelay`'s `finish_errors`) and is billed the text it relayed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.base import Adapter, ProbeClient, UpstreamRequest
from llm_gateway.adapters.error_bodies import EngineError, json_object, parse_error_body, upstream_error
from llm_gateway.adapters.field_table import FieldTable
from llm_gateway.adapters.prom_text import parse_samples, peak, total
from llm_gateway.adapters.relay_base import ChargedError, estimate_tokens
from llm_gateway.adapters.sse_relay import SSERelay, text_bytes, usage_from
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import BackendInfo, CallContext, Endpoint, LoadSnapshot, ProbeResult, ProbeState, Usage
from llm_gateway.wire.client_body import encode

_AUTH_HINT = ": the engine refused the gateway's key (check backends[].api_key)"
PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
#: llama.cpp's name for the repetition penalty, renamed to the one vLLM, SGLang, TabbyAPI, LMDeploy read
TO_REPETITION_PENALTY: Mapping[str, str] = MappingProxyType({"repeat_penalty": "repetition_penalty"})


#: the chat fields that shape a prompt's tokens (the chat template renders them), for token counting
PROMPT_FIELDS = ("messages", "tools", "chat_template_kwargs")


def prompt_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The fields of an OpenAI chat body that the engine's chat template renders into the prompt."""
    return {k: body[k] for k in PROMPT_FIELDS if body.get(k) is not None}


def json_field(data: bytes, key: str) -> Any:
    """`key` of a JSON object body, or None when the body is not one."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj.get(key) if isinstance(obj, dict) else None


def window_size(value: Any) -> int | None:
    """A context window an engine reported: a positive integer, else None (not known)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def spent_usage(obj: dict[str, Any]) -> Usage:
    """What a whole answer's generation spent: the engine's usage when it counted the completion, else
    (no usage, or a completion of 0 beside generated text) its prompt count and an estimate of the text
    of every choice (content, reasoning, tool-call arguments; `text` on completions)."""
    u = usage_from(obj)
    if u is not None and u.completion_tokens > 0:
        return u
    choices = obj.get("choices")
    n = text_bytes(orjson.dumps(choices)) if isinstance(choices, list) else 0
    return Usage(u.prompt_tokens if u is not None else 0, estimate_tokens(n))


def include_usage(body: dict[str, Any]) -> None:
    """Ask the engine for usage (`stream_options.include_usage`), keeping the client's other stream options."""
    so = body.get("stream_options")
    body["stream_options"] = {**so, "include_usage": True} if isinstance(so, dict) else {"include_usage": True}


class OpenAICompatAdapter(Adapter):
    kind: ClassVar[str] = "openai"
    formats: ClassVar[frozenset[str] | None] = None
    #: (running, waiting, kv) metric names, each a tuple of alternatives tried in order
    load_metrics: ClassVar[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None] = None
    #: (prompt tokens computed, prefix-cache queried tokens, hit tokens) counter names, read with the load
    cache_metrics: ClassVar[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = ((), (), ())
    #: the engine's name for reasoning text, renamed to the configured one on the way out
    reasoning_key: ClassVar[str | None] = None
    #: finish reasons that mean the generation failed (SGLang/LMDeploy "abort", "error")
    error_finish_reasons: ClassVar[tuple[str, ...]] = ()
    #: finish reasons renamed to OpenAI's ("parse_error" -> "stop")
    finish_renames: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: request fields the engine spells differently (the client's name -> the engine's), renamed in
    #: `build()` before `translate()`; only when the body does not already carry the engine's name
    renames: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: the paths probed: readiness, models (and metrics when load_metrics is set)
    health_path: ClassVar[str | None] = "/health"
    models_path: ClassVar[str] = "/v1/models"
    metrics_path: ClassVar[str] = "/metrics"
    #: the model-card field of `models_path` that holds the model's context window (vLLM, SGLang:
    #: `max_model_len`); None: the cards do not say
    window_field: ClassVar[str | None] = None
    #: a ready engine has its models loaded (one loaded model, served until it stops): True for the
    #: engines here; False for an unknown OpenAI-compatible server (it may load on demand): not told
    resident_when_ready: ClassVar[bool] = True
    #: what becomes of each OpenAI request field on this engine; None (an unknown OpenAI-compatible
    #: server): every field is sent as it is, the server answers for it
    field_table: ClassVar[FieldTable | None] = None
    #: does the engine send a stream's error as a flat `{"object": "error", ...}` event (trtllm-serve)?
    flat_stream_errors: ClassVar[bool] = False

    def __init__(self, backend: BackendInfo) -> None:
        super().__init__(backend)
        self.metrics_body: bytes | None = None  # the last probe's metrics page (vLLM's sleep state)
        self.headers = {"Content-Type": "application/json", **self.auth_headers()}
        self._finish_errors = tuple(b'"finish_reason":"' + r.encode() + b'"' for r in self.error_finish_reasons)
        self._finish_renames = tuple(
            (b'"finish_reason":"' + a.encode() + b'"', b'"finish_reason":"' + b.encode() + b'"')
            for a, b in self.finish_renames
        )

    # -- requests ----------------------------------------------------------------------------------
    def auth_headers(self) -> dict[str, str]:
        key = self.backend.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def build(self, endpoint: Endpoint, body: dict[str, Any], ctx: CallContext) -> UpstreamRequest:
        if self.field_table is not None:
            self.field_table.check(endpoint, body)  # the engine would drop it: a 400 before any call
        b = dict(body)
        b["model"] = ctx.upstream_model
        if ctx.priority_rank is not None and "priority" not in b:
            b["priority"] = self.engine_priority(ctx.priority_rank)
        if ctx.stream:
            include_usage(b)
        if endpoint == "chat":
            limit = b.get("max_completion_tokens")
            if limit is None:  # null is absent: max_tokens then says it
                limit = b.get("max_tokens")
            if isinstance(limit, int):  # engines read one or the other: send both
                b["max_tokens"] = b["max_completion_tokens"] = limit
        for ours, theirs in self.renames.items():
            if ours in b and theirs not in b:
                b[theirs] = b.pop(ours)
        self.translate(endpoint, b)
        if ctx.slot is not None and self.slot_field is not None:
            b[self.slot_field] = ctx.slot
        if ctx.lora is not None and self.lora is not None:
            self.lora.apply(b, ctx.lora)
        headers = {**self.headers, "X-Request-Id": ctx.request_id}
        return UpstreamRequest("POST", PATHS[endpoint], headers, encode(b, body))  # the client's bytes if it can

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        """Engine-specific rewrites of request fields beyond `renames`, in place on the gateway's copy."""

    # -- responses ---------------------------------------------------------------------------------
    def response_body(self, body: bytes, ctx: CallContext) -> tuple[bytes, Usage | None]:
        obj = json_object(body, self.backend.name, self.kind)
        if "error" in obj and "choices" not in obj and "data" not in obj:
            raise self.error_from_frame(obj)
        if "model" in obj:
            obj["model"] = ctx.public_model
        self.fix_choices(obj, ctx)
        return orjson.dumps(obj), usage_from(obj)

    def fix_choices(self, obj: dict[str, Any], ctx: CallContext) -> None:
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        failed = next(
            (
                ch["finish_reason"]
                for ch in choices
                if isinstance(ch, dict) and ch.get("finish_reason") in self.error_finish_reasons
            ),
            None,
        )
        if failed is not None:  # a failed generation, whatever the other choices did: an error that still pays
            raise ChargedError(
                f"backend '{self.backend.name}' ({self.kind}) ended the generation with finish_reason '{failed}'",
                usage=spent_usage(obj),
                status=502,
                code="generation_failed",
                backend=self.backend.name,
            )
        #: the finish reasons the answer will say, for the request's span (CallContext.finish_reasons): None where
        #: a choice is not an object or has a `stop_reason` (vLLM's stop string: a span reads every `stop_reason`
        #: too), and the span then reads them from the bytes
        reasons: list[str] | None = []
        for ch in choices:
            if not isinstance(ch, dict):
                reasons = None
                continue
            fr = said = ch.get("finish_reason")
            for a, b in self.finish_renames:
                if fr == a:
                    ch["finish_reason"] = said = b
            msg = ch.get("message")
            rk = self.reasoning_key
            if rk and isinstance(msg, dict) and rk in msg and rk != ctx.reasoning_field:
                msg[ctx.reasoning_field] = msg.pop(rk)
            if reasons is not None:
                if ch.get("stop_reason") is not None:
                    reasons = None
                elif type(said) is str:
                    reasons.append(said)
        ctx.finish_reasons = reasons

    def relay(self, ctx: CallContext) -> SSERelay:
        reps: tuple[tuple[bytes, bytes], ...] = ()
        rk = self.reasoning_key
        if rk and rk != ctx.reasoning_field:
            reps = ((b'"' + rk.encode() + b'":', b'"' + ctx.reasoning_field.encode() + b'":'),)
        return SSERelay(
            ctx,
            self.error_from_frame,
            replacements=reps,
            finish_errors=self._finish_errors,
            finish_renames=self._finish_renames,
            flat_errors=self.flat_stream_errors,
        )

    # -- errors ------------------------------------------------------------------------------------
    def error(self, status: int, body: bytes, content_type: str) -> EngineErrorAnswer:
        err = parse_error_body(body, content_type)
        if status == 404:
            return EngineErrorAnswer(
                f"backend '{self.backend.name}' ({self.kind}) does not serve this model or route: {err.message}",
                status=502,
                code="upstream_model_not_found",
                retryable=True,
                backend=self.backend.name,
            )
        return self.classify(status, err)

    def classify(self, status: int, err: EngineError) -> EngineErrorAnswer:
        """Status mapping hook: the default keeps 4xx as client errors and retries 502/503/504/429."""
        return upstream_error(self.backend.name, self.kind, status, err, retryable=status in (429, 502, 503, 504))

    def error_from_frame(self, obj: Mapping[str, Any]) -> EngineErrorAnswer:
        """An error object sent inside a stream (or in a 2xx body)."""
        err = parse_error_body(orjson.dumps(obj))
        status = 502
        code = err.code
        if code is not None and code.isdigit() and 400 <= int(code) < 600:
            status = int(code)
        if 400 <= status < 500 and status not in (401, 403, 404):
            return upstream_error(self.backend.name, self.kind, status, err, retryable=False)
        return EngineErrorAnswer(
            f"backend '{self.backend.name}' ({self.kind}) failed mid-stream: {err.message}",
            status=502,
            code="upstream_stream_error",
            backend=self.backend.name,
        )

    # -- probes ------------------------------------------------------------------------------------
    async def probe(self, client: ProbeClient) -> ProbeResult:
        state, detail = await self.probe_ready(client)
        if state != "ready":
            return ProbeResult(state, detail=detail)
        models, windows = await self.probe_catalog(client)
        self.metrics_body = None
        load = await self.probe_load(client) if self.load_metrics else None
        return ProbeResult(
            "ready", load=load, models=models, detail=detail, context_lengths=windows, resident=self.residency(models)
        )

    def residency(self, models: frozenset[str] | None) -> dict[str, bool] | None:
        """Which of a ready engine's models are loaded: all of them (`resident_when_ready`), else unknown."""
        return dict.fromkeys(models, True) if models and self.resident_when_ready else None

    async def probe_ready(self, client: ProbeClient) -> tuple[ProbeState, str]:
        if self.health_path is None:
            status, _ = await client.get(self.models_path, self.auth_headers())
        else:
            status, _ = await client.get(self.health_path)
        path = self.health_path or self.models_path
        if status == 200:
            return "ready", ""
        if status == 503:
            return "loading", f"{path} answered 503"
        return "down", f"{path} answered {status}{_AUTH_HINT if status in (401, 403) else ''}"

    async def probe_catalog(self, client: ProbeClient) -> tuple[frozenset[str] | None, dict[str, int] | None]:
        """The served models, and the context window of each where the engine's model cards say it
        (`window_field`); None for what the engine did not say."""
        status, body = await client.get(self.models_path, self.auth_headers())
        if status != 200:
            return None, None
        try:
            data = orjson.loads(body).get("data")
        except (orjson.JSONDecodeError, AttributeError):
            return None, None
        if not isinstance(data, list):
            return None, None
        cards = [m for m in data if isinstance(m, dict) and "id" in m]
        windows = None
        if self.window_field is not None:
            windows = {str(m["id"]): n for m in cards if (n := window_size(m.get(self.window_field))) is not None}
        return frozenset(str(m["id"]) for m in cards), windows or None

    async def probe_load(self, client: ProbeClient) -> LoadSnapshot | None:
        assert self.load_metrics is not None
        status, body = await client.get(self.metrics_path, self.auth_headers())
        if status != 200:
            return None
        self.metrics_body = body
        samples = parse_samples(body)
        running_names, waiting_names, kv_names = self.load_metrics
        computed, queries, hits = self.cache_metrics
        return LoadSnapshot(
            running=_first(samples, running_names, total),
            waiting=_first(samples, waiting_names, total),
            kv=_first(samples, kv_names, peak),  # a fraction per data-parallel rank: the fullest one counts
            at=client.now(),
            computed=_first(samples, computed, total),
            cache_queries=_first(samples, queries, total),
            cache_hits=_first(samples, hits, total),
        )


def _first(
    samples: dict[str, list[float]],
    names: tuple[str, ...],
    combine: Callable[[dict[str, list[float]], str], float | None],
) -> float | None:
    """The first of `names` that is present; a "+name" adds its value (LMDeploy's API-layer queue)."""
    found: float | None = None
    for name in names:
        if name.startswith("+"):
            v = combine(samples, name[1:])
            if v is not None and found is not None:
                found += v
        elif found is None:
            found = combine(samples, name)
    return found
