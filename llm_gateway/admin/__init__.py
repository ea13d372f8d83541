"""The control plane: a FastAPI admin API under /admin (keys at runtime, the audit log).

Not on the hot path, so FastAPI fits (pydantic schemas, OpenAPI at /admin/docs); the data plane stays
raw ASGI (llm_gateway/http). The composition root (llm_gateway/app.py) builds the app with
`admin.app.build_admin_app` and mounts it under /admin on the main port, or serves it alone on
`server.admin_port` (`admin.server`). Modules: `context` (what the routes share), `security` (the admin
role: `require_admin`), `schemas` (the wire models), `store` (the keys and audit tables), `refresh`
(keeps every replica's in-memory runtime keys in step with the table), `keys` and `audit` (routers).
"""
