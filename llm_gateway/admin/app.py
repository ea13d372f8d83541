"""Building the admin API: one FastAPI app whose routes all live under /admin, with its OpenAPI document
at /admin/openapi.json (an admin key needed, like every admin route).

In front of it all is the gate (admin/gate.py: the admin key checked from the headers before any body is
read, and one access line per request), then `BodyLimit` (size and time). The docs page `/admin/docs` is off
unless `admin.docs` is on, and then it is a page of the gateway's own, offline: the routes and their
summaries, no script, a CSP that allows nothing else (FastAPI's Swagger UI loads its script from a CDN, on the
page where an operator would paste the admin key: red-team L5).

`build_admin_app(ctx, routers)` includes each router under the /admin prefix; `ROUTERS` is the list the
composition root passes. A new concern is one module with an `APIRouter` whose routes take
`AdminUser` (llm_gateway.admin.security: the admin role) and `Depends(admin_context)` (the shared
objects), added to `ROUTERS`. The app has no lifespan of its own: its objects are started and stopped by
the composition root (llm_gateway/app.py) with the gateway's.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse

from llm_gateway.admin import audit, errors, keys
from llm_gateway.admin.context import AdminContext
from llm_gateway.admin.gate import AdminGate

PREFIX = "/admin"
#: admin requests are small: a body past this is refused (413) before anything reads it whole
MAX_BODY_BYTES = 256 * 1024
ROUTERS: tuple[APIRouter, ...] = (keys.router, audit.router)


def build_admin_app(ctx: AdminContext, routers: Sequence[APIRouter] = ROUTERS) -> FastAPI:
    app = FastAPI(
        title="llm-gateway admin API",
        version="1",
        description="Keys at runtime and the audit log. Every route needs an admin key (admin.keys in the "
        "config) as `Authorization: Bearer <key>` or `x-api-key: <key>`; client keys are refused.",
        openapi_url=PREFIX + "/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.admin = ctx
    errors.install(app)
    app.add_middleware(errors.BodyLimit, max_bytes=MAX_BODY_BYTES, timeout_s=ctx.gw.server.body_timeout_s)
    public = {STATUS_PAGE, PREFIX + STATUS_PAGE}  # the status page's HTML (its data needs the key)
    if ctx.gw.runtime.config.admin.docs:
        public.add(DOCS)
        app.add_api_route(DOCS, lambda: _docs_page(app), methods=["GET"], include_in_schema=False)
    app.add_middleware(AdminGate, ctx=ctx, public_paths=public)  # added last: the outermost, before BodyLimit
    for router in routers:
        app.include_router(router, prefix=PREFIX)
    return app


STATUS_PAGE = "/status"
DOCS = PREFIX + "/docs"
DOCS_HEADERS = {
    "content-security-policy": "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


def _docs_page(app: FastAPI) -> HTMLResponse:
    """The admin API's routes and their summaries, from its OpenAPI document: plain HTML, nothing loaded."""
    doc = app.openapi()
    rows = []
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            summary = op.get("summary") or ""
            rows.append(
                f"<tr><td><code>{html.escape(method.upper())}</code></td><td><code>{html.escape(path)}</code></td>"
                f"<td>{html.escape(summary)}</td></tr>"
            )
    page = (
        "<!doctype html><html><head><meta charset=utf-8><title>llm-gateway admin API</title></head><body>"
        f"<h1>llm-gateway admin API</h1><p>{html.escape(doc.get('info', {}).get('description', ''))}</p>"
        f"<p>The OpenAPI document: <code>{PREFIX}/openapi.json</code> (with an admin key).</p>"
        "<table><tr><th>method</th><th>path</th><th>what</th></tr>" + "".join(rows) + "</table></body></html>"
    )
    return HTMLResponse(page, headers=DOCS_HEADERS)
