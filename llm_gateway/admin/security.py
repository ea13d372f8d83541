"""The admin role: `require_admin`, the dependency every admin route takes (and routers can take whole,
`APIRouter(dependencies=[Depends(require_admin)])`).

Admin keys are configured as digests (`admin.keys: [{name, sha256}]`), hashed like client keys and
presented the same way (`Authorization: Bearer <key>` or `x-api-key: <key>`), and looked up by digest
with a constant-time confirmation. They are a role of their own: a client key is refused here (401),
and an admin key is no client key (the config refuses a digest in both lists). The admin keys follow
config reloads. The admin's name is who the audit log says acted. The same check runs first in the admin
app's gate (admin/gate.py), from the headers alone, before anything reads a body.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from llm_gateway.errors import AuthenticationFailed
from llm_gateway.settings import AdminConfig

_bearer = HTTPBearer(auto_error=False, description="an admin key (admin.keys), as `Authorization: Bearer <key>`")
_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="an admin key (admin.keys)")
CHALLENGE = "Bearer"
_CHALLENGE = {"www-authenticate": CHALLENGE}
MISSING_KEY = "You didn't provide an admin key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
INVALID_KEY = "Incorrect admin key provided."


@dataclass(frozen=True, slots=True)
class Admin:
    """An authenticated administrator: the name of the admin key it presented."""

    name: str


class AdminKeys:
    """digest -> admin name for the current config's `admin` section (rebuilt when a reload swaps it)."""

    def __init__(self) -> None:
        self._cfg: AdminConfig | None = None
        self._by_digest: dict[bytes, tuple[bytes, str]] = {}

    def lookup(self, cfg: AdminConfig, token: bytes) -> str | None:
        if cfg is not self._cfg:
            self._by_digest = {bytes.fromhex(k.sha256): (bytes.fromhex(k.sha256), k.name) for k in cfg.keys}
            self._cfg = cfg
        digest = hashlib.sha256(token).digest()
        found = self._by_digest.get(digest)
        if found is None or not hmac.compare_digest(found[0], digest):
            return None
        return found[1]


async def require_admin(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    x_api_key: Annotated[str | None, Security(_api_key)],
) -> Admin:
    token = bearer.credentials.strip() if bearer is not None else (x_api_key or "").strip()
    if not token:
        raise AuthenticationFailed(MISSING_KEY, code="missing_api_key", headers=dict(_CHALLENGE))
    ctx = request.app.state.admin  # the AdminContext (llm_gateway.admin.context)
    name = ctx.admin_keys.lookup(ctx.gw.runtime.config.admin, token.encode())
    if name is None:
        raise AuthenticationFailed(INVALID_KEY, headers=dict(_CHALLENGE))
    return Admin(name)


AdminUser = Annotated[Admin, Depends(require_admin)]
