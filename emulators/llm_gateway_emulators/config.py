"""EmulatorConfig: every knob of an emulator, validated, mutable at run time.

Owns the knob names, their defaults, the list of engines and fault names, and the
merge of a JSON object (from ``POST /_emulator/config``) into a live config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ENGINES: tuple[str, ...] = (
    "llama-server",
    "vllm",
    "sglang",
    "ollama",
    "tabbyapi",
    "lmdeploy",
    "aphrodite",
    "trtllm",
    "tgi",
    "mlc",
    "lmstudio",
    "dynamo",
)

#: Faults that take no argument. ``error_status:<code>`` is accepted as well.
FAULTS: frozenset[str] = frozenset(
    {
        "reset_mid_stream",
        "garbage_sse",
        "truncated_sse",
        "huge_chunk",
        "stall_stream",
        "stall_body",
        "html_200",
        "no_answer",
        "mid_stream_error",
        "slow_first_byte",
        "ollama_repeat_abort",
        "engine_abort",
    }
)

HEALTH_STATES: frozenset[str] = frozenset({"auto", "unhealthy", "sleeping"})


def check_fault(name: str | None) -> None:
    """Raise ValueError unless ``name`` is None, a known fault or ``error_status:<code>``."""
    if name is None or name in FAULTS:
        return
    if name.startswith("error_status:"):
        code = name.split(":", 1)[1]
        if code.isdigit() and 100 <= int(code) <= 599:
            return
    raise ValueError(f"unknown fault {name!r}")


@dataclass
class EmulatorConfig:
    """All knobs. Mutating a field affects the next request (and, for timing, the next token)."""

    engine: str = "vllm"
    model: str = "tiny"
    api_key: str | None = None
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    slots: int = 4
    max_queue: int | None = None
    load_delay_s: float = 0.0
    fault: str | None = None
    fault_after_chunks: int = 2
    fault_count: int | None = None
    embeddings: bool = False
    #: vLLM serving a score/rerank model (its /rerank and /score routes) or a speech model (/v1/audio/*)
    scoring: bool = False
    speech: bool = False
    metrics: bool = True
    # --- extra knobs (all optional) ---
    #: TabbyAPI keep-alive comment interval (sse-starlette default 15 s).
    ping_interval_s: float = 15.0
    #: Size of the data event sent by the ``huge_chunk`` fault.
    huge_chunk_bytes: int = 8 * 1024 * 1024
    #: When set, the engine reports this waiting/queue number instead of the real one.
    report_waiting: int | None = None
    #: When set, the engine reports this KV-cache usage (0..1) instead of the computed one.
    report_kv_usage: float | None = None
    #: Tokens generated before the emulated EOS when a request sets no token limit.
    natural_stop_tokens: int = 16
    #: The first N generated tokens are reasoning, sent in the engine's reasoning field
    #: (llama.cpp/SGLang/TabbyAPI/LMDeploy ``reasoning_content``, vLLM ``reasoning``, Ollama
    #: ``/v1`` ``reasoning`` and native ``message.thinking``); they count as completion tokens.
    reasoning_tokens: int = 0
    #: Context length per sequence (max_model_len / n_ctx / num_ctx).
    ctx_len: int = 4096
    #: "auto" follows the load state machine; "unhealthy" makes /health fail the engine's
    #: way (vLLM dead engine, SGLang 503, Tabby issues, LMDeploy unhealthy); "sleeping"
    #: is LMDeploy's sleep mode (health 200, inference 503 engine_unavailable).
    health: str = "auto"
    #: Idle keep-alive timeout of the server (None = engine default: 5 s for llama.cpp
    #: and the uvicorn-based engines, unlimited for Ollama's Go server).
    keepalive_timeout_s: float | None = None
    #: llama.cpp: behave like build aa6192d (chat-body parse errors are 500 server_error,
    #: n != 1 rejected, max_completion_tokens ignored). Default: the captured newer build.
    llama_legacy: bool = False
    #: Ollama: behave like the captured 0.5.4 build (role on every /v1 chunk, no separate
    #: empty-delta finish chunk, 404 -> api_error). Default: HEAD fb30760, as ollama/ollama's
    #: openai/openai.go and server/routes.go are at that commit.
    ollama_legacy: bool = False
    #: Ollama: more models served besides ``model`` (each loads on its own first request).
    extra_models: tuple[str, ...] = ()
    #: Ollama: OLLAMA_MAX_LOADED_MODELS; loading one more unloads one first (0: Ollama's automatic 3).
    max_loaded_models: int = 0
    #: SGLang: seconds /health and /health_generate take when healthy (real: >= 1 s).
    sglang_health_delay_s: float = 0.0
    #: TabbyAPI admin key (x-admin-key / Bearer); api_key is the ordinary API key.
    admin_key: str | None = None
    #: Emulated engine version strings (None = engine default).
    version: str | None = None
    #: Tokens per stream event (vLLM/SGLang ``--stream-interval``): the deltas of this many tokens go
    #: out together in one SSE event or NDJSON line (the last event holds what is left).
    tokens_per_event: int = 1
    #: vLLM: sleep mode (`--enable-sleep-mode` with VLLM_SERVER_DEV_MODE=1): POST /sleep, POST /wake_up and
    #: GET /is_sleeping; a request that arrives asleep waits unscheduled until the wake-up; the engine starts awake.
    sleep_mode: bool = False
    #: vLLM sleep mode: seconds POST /wake_up takes (weights back onto the GPU).
    wake_delay_s: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError on an invalid combination of knobs."""
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        check_fault(self.fault)
        if self.slots < 0:
            raise ValueError("slots must be >= 0")
        if self.max_queue is not None and self.max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        if self.health not in HEALTH_STATES:
            raise ValueError(f"health must be one of {sorted(HEALTH_STATES)}")
        if self.fault_after_chunks < 0:
            raise ValueError("fault_after_chunks must be >= 0")
        if self.tokens_per_event < 1:
            raise ValueError("tokens_per_event must be >= 1")
        if self.max_loaded_models < 0:
            raise ValueError("max_loaded_models must be >= 0")
        if isinstance(self.extra_models, str) or not all(isinstance(m, str) and m for m in self.extra_models):
            raise ValueError("extra_models must be a list of model names")
        self.extra_models = tuple(self.extra_models)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def merge(self, updates: dict[str, Any]) -> None:
        """Apply a partial update atomically: all keys are checked before any is set."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(updates) - names)
        if unknown:
            raise ValueError(f"unknown config key(s): {', '.join(unknown)}")
        if "engine" in updates and updates["engine"] != self.engine:
            raise ValueError("engine cannot be changed at run time")
        trial = dataclasses.replace(self, **updates)  # runs validate()
        for key in updates:
            setattr(self, key, getattr(trial, key))

    @property
    def ttft_s(self) -> float:
        return max(0.0, self.ttft_ms) / 1000.0

    @property
    def tpot_s(self) -> float:
        return max(0.0, self.tpot_ms) / 1000.0
