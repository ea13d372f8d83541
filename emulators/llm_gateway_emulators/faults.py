"""Which request gets a fault.

``config.fault`` names the fault; with ``config.fault_count`` set, only that many more
inference requests get it (the count goes down by one per request, and at zero both
knobs are cleared); with ``fault_count`` None every inference request gets it. What each
fault does lives in ``engine.Engine.generate`` (the shared driver) and in each engine's
``StreamFormat`` (the engine-specific bytes: in-band errors, huge events, repeat abort).

Faults (K = ``fault_after_chunks``, counted in token chunks written):

- ``reset_mid_stream``: after K chunks the connection is reset (RST via SO_LINGER 0);
  non-stream: reset instead of the response.
- ``garbage_sse``: after K chunks, malformed lines (non-JSON, unterminated JSON, no field
  name, binary, empty event), then the stream goes on normally; non-stream: a body that
  is not valid JSON.
- ``truncated_sse``: after K chunks, the first half of the next event, then the chunked
  body is terminated and the connection closed (FIN); non-stream: half of the body
  (Content-Length says the full size), then FIN.
- ``huge_chunk``: after K chunks one valid event whose content is ``huge_chunk_bytes``
  long, then the stream goes on; non-stream: the message content is that long.
- ``stall_stream``: K chunks, then silence with the connection held open.
- ``stall_body``: non-stream: status, headers (with Content-Length) and half the body,
  then silence; stream: same as ``stall_stream``.
- ``html_200``: a 200 ``text/html`` page (a proxy error page) instead of the response.
- ``no_answer``: the request is read and never answered.
- ``mid_stream_error``: after K chunks the engine's own in-band error, exactly as that
  engine terminates (or not) the stream; non-stream: the engine's generation-failure
  error response. llama.cpp with K=0 answers a plain HTTP error, as it does when the
  first result is an error.
- ``error_status:<code>``: the engine's own error envelope with that status.
- ``slow_first_byte``: ``ttft_ms`` is spent before the status line is sent.
- ``ollama_repeat_abort``: Ollama's repeated-token abort: after K chunks the stream ends
  with no ``done`` line (native) / no finish chunk and no ``[DONE]`` (``/v1``);
  non-stream: ``done: false`` (native) / ``finish_reason: null`` and zero usage (``/v1``).
- ``engine_abort``: the engine aborts the generation after K tokens with its own finish reason
  (``Engine.abort_reason``: SGLang, LMDeploy and vLLM "abort", from the engines' sources cited
  in tests/unit/test_abort_reasons.py), with the usage so far: the finish chunk (stream) or
  the whole answer's choice. Engines without one (llama.cpp, TabbyAPI, Ollama) answer normally.
"""

from __future__ import annotations

from llm_gateway_emulators.config import EmulatorConfig


def take_fault(config: EmulatorConfig) -> str | None:
    """The fault for the request starting now, consuming one from ``fault_count``."""
    fault = config.fault
    if not fault:
        return None
    if config.fault_count is not None:
        if config.fault_count <= 0:
            config.fault = None
            config.fault_count = None
            return None
        config.fault_count -= 1
        if config.fault_count == 0:
            config.fault = None
            config.fault_count = None
    return fault
