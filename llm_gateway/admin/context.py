"""What the admin routes share: the gateway, its database (opened on first need), the key refresher
and the clock. Hung on the FastAPI app as `app.state.admin` by `build_admin_app`; routes take it with
`Depends(admin_context)`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from llm_gateway.admin.security import AdminKeys
from llm_gateway.service.runtime import Gateway

if TYPE_CHECKING:
    from llm_gateway.admin.refresh import KeyRefresher
    from llm_gateway.state.database import Database


@dataclass(eq=False)
class AdminContext:
    gw: Gateway
    #: the gateway's database, opened once on first need (raises DatabaseUnavailable, 503)
    database: Callable[[], Awaitable[Database]]
    refresher: KeyRefresher
    admin_keys: AdminKeys = field(default_factory=AdminKeys)
    clock: Callable[[], float] = field(default=time.time)


def admin_context(request: Request) -> AdminContext:
    ctx: AdminContext = request.app.state.admin
    return ctx
