"""MLX-LM's server (`mlx_lm.server`, Apple's MLX; on Linux `pip install "mlx-lm[cpu]"`).

Read from ml-explore/mlx-lm `mlx_lm/server.py` (mlx-lm 0.32.2 as installed by scripts/install_mlx.sh; the
stored snapshot read is @0130d3b7f16938c437cf69c37e88e1182da12fc1) and checked against the real server
(tests/contract, `mlx/real`):

- `BaseHTTPRequestHandler` on a `ThreadingHTTPServer`: HTTP/1.0, every connection closes after its
  answer (`closes_after_stream`; pooled keep-alive gives nothing there). No auth.
- `GET /health` is `{"status": "ok"}` 200, or 503 `"unavailable"`. `GET /v1/models` lists the models in
  the Hugging Face cache (`scan_cache_dir()`), sent *after* a 200 status line: with no cache folder the
  answer is a 200 with an empty body, which is read as "not told" (never as an empty list). Another
  model name in a request is loaded on demand, so residency is not told.
- No `/metrics` and no embeddings route (404 plain text): load is the gateway's own count, and
  deployments on it cannot declare `embeddings`.
- Errors are `{"error": "<text>"}` (400 for a bad field value, 404 with the loader's message for a
  model it cannot load).
- Request fields (`do_POST`, `validate_model_parameters`): max_completion_tokens (else max_tokens),
  temperature, top_p, presence/frequency_penalty, logit_bias, logprobs (a bool), top_logprobs, seed,
  stop and tools are read; n, response_format, tool_choice, parallel_tool_calls and reasoning_effort
  are never read: refused. Completions read no echo, best_of or suffix, and their `logprobs` must be a
  bool there (OpenAI's is a count): refused. Its own extras (top_k, min_p, xtc_*, repetition_penalty,
  chat_template_kwargs, draft_model, adapters) pass through.
- `stop` strings are matched by token ids (`make_stop_sequences` tokenises each stop word alone): one
  that tokenises alone as it does in the reply (a word with its leading space) ends the generation with
  finish_reason "stop"; another one is cut out of the text while the generation runs on to its limit
  (seen on the real server; an engine bug, not worked around here).
- Streams: `include_usage` adds a last chunk with `choices: []` and `"object": "chat.completion"`;
  prompt processing sends `: keepalive` comments (read by the shared SSE relay).
"""

from __future__ import annotations

from typing import ClassVar

from llm_gateway.adapters.field_table import FieldTable, chat_fields, completions_fields, passed, refused
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter

_AT = "mlx_lm/server.py do_POST (mlx-lm 0.32.2)"
_NEVER = "never read by mlx_lm.server (mlx_lm/server.py do_POST, mlx-lm 0.32.2)"
_READ = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "logit_bias")
FIELDS = FieldTable(
    "MLX-LM",
    chat_fields(
        {
            **{k: passed(_AT) for k in ("messages", "stream", *_READ, "logprobs", "top_logprobs", "tools")},
            "n": refused(_NEVER, 1),
            "response_format": refused(_NEVER, {"type": "text"}),
            "tool_choice": refused(_NEVER, "auto"),
            "parallel_tool_calls": refused(_NEVER, True),
            "reasoning_effort": refused(_NEVER),
        }
    ),
    completions_fields(
        {
            **{k: passed(_AT) for k in ("prompt", "stream", "max_tokens", *_READ)},
            "n": refused(_NEVER, 1),
            "logprobs": refused("a bool there (validate_model_parameters), not OpenAI's count", 0),
            "echo": refused(_NEVER, False),
            "best_of": refused(_NEVER, 1),
            "suffix": refused(_NEVER, ""),
        }
    ),
)


class MLXAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "mlx"
    formats: ClassVar[frozenset[str] | None] = frozenset({"mlx", "safetensors"})
    unsupported_capabilities: ClassVar[frozenset[str]] = frozenset({"embeddings"})
    resident_when_ready: ClassVar[bool] = False  # other names load on demand; /v1/models is the HF cache
    closes_after_stream: ClassVar[bool] = True
    field_table: ClassVar[FieldTable | None] = FIELDS
