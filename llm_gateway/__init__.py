"""llm-gateway: one OpenAI-compatible endpoint in front of local LLM engines.

The plan of the house, bottom first; every import points down (tests/unit/test_import_graph.py):
- `errors` (the one error tree), `types` (endpoint kinds, usage, load snapshots), `exchange` (what
  the service needs from the HTTP layer): the shared vocabulary, importing nothing of the project;
- `wire/`: client-API wire formats the adapters and the dialects share (SSE bytes, chat stream events and
  the translation a relay drives, Anthropic's error types/ids/usage);
- `adapters/` (one module per engine; all engine knowledge), `upstream/` (the upstream client seam,
  the gateway's own HTTP/1.1 client by default);
- `settings/` (the config schema and its loader);
- `access/` (keys, limit stores, the limiter: who may call and how much);
- `state/` (the database), `observability/` (metrics, access log, records, the usage ledger);
- `routing/` (the table and every decision over it, from reading a request to dispatch and probes);
- `service/` (the request pipeline: runtime, one request's state and steps, the stream relay, reload);
- `http/` (the HTTP server alone: raw ASGI by a route table, the hardened uvicorn protocol);
- `dialects/` (the client APIs: OpenAI, Anthropic Messages, Responses, ops; the route table);
- `admin/` (the control plane), `app` (the composition root), `cli` (the `llm-gateway` command).
"""

__version__ = "0.1.0"
