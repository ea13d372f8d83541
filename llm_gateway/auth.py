"""API keys: who is calling, and which public models they may use.

The config holds only SHA-256 digests of keys. A presented key is hashed, the digest looked up, and
the match confirmed with `hmac.compare_digest`; the lookup is by digest, so its timing says nothing
about the key itself. Keys arrive as `Authorization: Bearer <key>` or `x-api-key: <key>`, and are
never forwarded to an engine, logged, or put in a metric label or an error message.
Two sets of keys: the config file's (`auth.keys`, fixed for one config) and the runtime keys created
through the admin API (held in the gateway database). The request path never reads the database: the
runtime keys are a second, swappable table here (`set_runtime_keys`, replaced whole by the admin key
refresher when the keys table changes); a runtime key may carry an expiry, checked on each use.
A model outside the key's allowlist is refused with 403 (not hidden as 404: on a team gateway,
"you may not use this model" is the more useful answer, and the model list is already public to
anyone holding a key); `/v1/models` lists only what the key may use.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_gateway.errors import AuthenticationFailed, PermissionDenied
from llm_gateway.settings import AuthConfig, KeyConfig, Limits

KEY_PREFIX = "sk-gw-"


def new_key() -> tuple[str, str]:
    """A fresh key and its digest."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, digest_of(key)


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(eq=False)
class Principal:
    """An authenticated caller (or the anonymous one in `auth: none` mode)."""

    name: str
    model_patterns: tuple[re.Pattern[str], ...]
    limits: Limits = field(default_factory=Limits)
    model_limits: tuple[tuple[re.Pattern[str], Limits], ...] = ()
    priority: str = "default"  # queue class (settings.PRIORITY_RANKS)
    weight: float = 1.0  # share against the other keys of its class
    _allowed: dict[str, bool] = field(default_factory=dict, repr=False)

    def may_use(self, model: str) -> bool:
        ok = self._allowed.get(model)
        if ok is None:
            ok = any(p.match(model) for p in self.model_patterns)
            if len(self._allowed) < 10_000:
                self._allowed[model] = ok
        return ok

    def limits_for(self, model: str) -> Limits | None:
        for pattern, lim in self.model_limits:
            if pattern.match(model):
                return lim
        return None


ANONYMOUS = Principal("anonymous", (re.compile(".*"),))


def principal_of(k: KeyConfig) -> Principal:
    return Principal(
        name=k.name,
        model_patterns=tuple(re.compile(fnmatch.translate(g)) for g in k.models),
        limits=k.limits,
        model_limits=tuple((re.compile(fnmatch.translate(g)), lim) for g, lim in k.model_limits.items()),
        priority=k.priority,
        weight=k.weight,
    )


@dataclass(frozen=True, slots=True, eq=False)
class RuntimeKey:
    """A key created at runtime (admin API): its digest, its principal, and when it stops working."""

    digest: bytes
    principal: Principal
    expires_at: float = math.inf  # unix seconds


def runtime_key(k: KeyConfig, expires_at: float | None = None) -> RuntimeKey:
    return RuntimeKey(bytes.fromhex(k.sha256), principal_of(k), math.inf if expires_at is None else expires_at)


class Authenticator:
    def __init__(self, cfg: AuthConfig) -> None:
        self.enabled = cfg.mode == "keys"
        self._by_digest: dict[bytes, tuple[bytes, Principal]] = {}
        for k in cfg.keys:
            d = bytes.fromhex(k.sha256)
            self._by_digest[d] = (d, principal_of(k))
        self._runtime: Mapping[bytes, RuntimeKey] = {}

    def authenticate(self, authorization: bytes | None, x_api_key: bytes | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        token: bytes | None = None
        if authorization:
            scheme, _, value = authorization.strip().partition(b" ")
            if scheme.lower() == b"bearer" and value.strip():
                token = value.strip()
        if token is None and x_api_key:
            token = x_api_key.strip() or None
        if token is None:
            raise AuthenticationFailed(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'.",
                code="missing_api_key",
            )
        digest = hashlib.sha256(token).digest()
        found = self._by_digest.get(digest)
        if found is None:
            return self._runtime_key(digest)
        if not hmac.compare_digest(found[0], digest):
            raise AuthenticationFailed("Incorrect API key provided.")
        return found[1]

    def _runtime_key(self, digest: bytes) -> Principal:
        rk = self._runtime.get(digest)
        if rk is None or not hmac.compare_digest(rk.digest, digest):
            raise AuthenticationFailed("Incorrect API key provided.")
        if rk.expires_at <= time.time():
            raise AuthenticationFailed("This API key has expired.", code="expired_api_key")
        return rk.principal

    @property
    def runtime_keys(self) -> Mapping[bytes, RuntimeKey]:
        return self._runtime

    def set_runtime_keys(self, keys: Mapping[bytes, RuntimeKey]) -> None:
        """Swap in the whole table of runtime keys (digest -> key); the caller never mutates it after."""
        self._runtime = keys

    @staticmethod
    def check_model(principal: Principal, model: str) -> None:
        if not principal.may_use(model):
            raise PermissionDenied(f"The key '{principal.name}' may not use the model '{model}'.", param="model")
