"""Building the admin API: one FastAPI app whose routes all live under /admin, with its OpenAPI document
at /admin/openapi.json and the docs at /admin/docs.

`build_admin_app(ctx, routers)` includes each router under the /admin prefix; `ROUTERS` is the list the
composition root passes. A new concern is one module with an `APIRouter` whose routes take
`AdminUser` (llm_gateway.admin.security: the admin role) and `Depends(admin_context)` (the shared
objects), added to `ROUTERS`. The app has no lifespan of its own: its objects are started and stopped by
the composition root (llm_gateway/app.py) with the gateway's.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, FastAPI

from llm_gateway.admin import audit, errors, keys
from llm_gateway.admin.context import AdminContext

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
        docs_url=PREFIX + "/docs",
        swagger_ui_oauth2_redirect_url=PREFIX + "/docs/oauth2-redirect",
        redoc_url=None,
    )
    app.state.admin = ctx
    errors.install(app)
    app.add_middleware(errors.BodyLimit, max_bytes=MAX_BODY_BYTES)
    for router in routers:
        app.include_router(router, prefix=PREFIX)
    return app
