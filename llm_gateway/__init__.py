"""llm-gateway: one OpenAI-compatible endpoint in front of local LLM engines.

The plan of the house, bottom first; every import points down (tests/unit/test_import_graph.py):
- `errors` (the one error tree), `types` (endpoint kinds, usage, load snapshots), `exchange` (what
  the service needs from the HTTP layer): the shared vocabulary, importing nothing of the project;
- `adapters/` (one module per engine; all engine knowledge), `upstream/` (the upstream client seam,
  aiohttp in production), `request_info` (reading an OpenAI body for what routing needs);
- `ingress/` (other APIs to and from OpenAI chat, pure translation: Anthropic Messages);
- `settings` (the config schema), `config_loader`, `auth` (keys), `routing/` (table, selection,
  admission, breaker), `limits/` (stores and limiter), `observability/` (metrics, access log);
- `candidates` (which deployments can serve a request, and whether it fits their context windows);
- `dispatch` (retries and failover), `prober` (health and load), `runtime` (shared objects and the
  per-config part a reload swaps), `service` (the steps of one request), `reload`;
- `http/` (raw ASGI surface, handlers, the hardened uvicorn protocol), `app` (the composition root),
  `cli` (the `llm-gateway` command).
"""

__version__ = "0.1.0"
