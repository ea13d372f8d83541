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

A key's identity is its `id`, never its name: stored responses, limiter scopes, budgets, fair-share
counters, usage rows and audit entries are keyed by it, so a name freed by deleting a key and taken by a
new one gives the new holder nothing of the old key's. A config key's id is derived from its digest (one
way: it reveals nothing of the digest), a runtime key's is minted when it is created and stored with it
(kept across rotation). The two kinds cannot collide: `kc_` and `kr_` prefixes.
Allowlists (`models`) and `model_limits` are judged against the canonical public model, never the alias
a request used: `alpha*` does not match the alias `alpha-big` of `beta-70b`. An entry that is no glob and
names an alias stands for the model it points to, in both.
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
CONFIG_ID_PREFIX = "kc_"
RUNTIME_ID_PREFIX = "kr_"
_GLOB_CHARS = frozenset("*?[")


def config_key_id(sha256_hex: str) -> str:
    """The id of a config-file key: derived from its digest, one way."""
    return CONFIG_ID_PREFIX + hashlib.sha256(b"llm-gateway/key-id\x00" + bytes.fromhex(sha256_hex)).hexdigest()[:24]


def new_key_id() -> str:
    """A fresh id for a runtime key (minted once, when it is created)."""
    return RUNTIME_ID_PREFIX + secrets.token_hex(12)


def _literal(glob: str) -> str | None:
    """The glob itself when it has no wildcard (it may name an alias), else None."""
    return None if _GLOB_CHARS.intersection(glob) else glob


def new_key() -> tuple[str, str]:
    """A fresh key and its digest."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, digest_of(key)


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(eq=False)
class Principal:
    """An authenticated caller (or the anonymous one in `auth: none` mode). `id` is who it is; `name` is
    the label shown in errors, logs, metrics and reports."""

    name: str
    model_patterns: tuple[re.Pattern[str], ...]
    limits: Limits = field(default_factory=Limits)
    model_limits: tuple[tuple[re.Pattern[str], Limits], ...] = ()
    priority: str = "default"  # queue class (settings.PRIORITY_RANKS)
    weight: float = 1.0  # share against the other keys of its class
    #: the allowlist's entries that are no glob (each may name an alias, which stands for its model)
    model_names: frozenset[str] = frozenset()
    #: per `model_limits` entry, in order: the entry when it is no glob (it may name an alias), else None
    limit_names: tuple[str | None, ...] = ()
    _allowed: dict[str, bool] = field(default_factory=dict, repr=False)
    id: str = field(kw_only=True)

    def may_use(self, model: str, aliases: tuple[str, ...] = ()) -> bool:
        """May it use the canonical public `model`, whose aliases are `aliases`?"""
        ok = self._allowed.get(model)
        if ok is None:
            ok = any(p.match(model) for p in self.model_patterns)
            if len(self._allowed) < 10_000:
                self._allowed[model] = ok
        if not ok and aliases and self.model_names:
            return not self.model_names.isdisjoint(aliases)
        return ok

    def limits_for(self, model: str, aliases: tuple[str, ...] = ()) -> Limits | None:
        """The first `model_limits` entry that matches the canonical `model` or names one of its `aliases`."""
        names = self.limit_names
        for i, (pattern, lim) in enumerate(self.model_limits):
            if pattern.match(model):
                return lim
            if aliases and i < len(names) and names[i] in aliases:
                return lim
        return None


ANONYMOUS = Principal("anonymous", (re.compile(".*"),), id="anonymous")


def principal_of(k: KeyConfig, key_id: str | None = None) -> Principal:
    """The principal of a key: a config key's id follows from its digest; a runtime key's is given."""
    return Principal(
        name=k.name,
        model_patterns=tuple(re.compile(fnmatch.translate(g)) for g in k.models),
        limits=k.limits,
        model_limits=tuple((re.compile(fnmatch.translate(g)), lim) for g, lim in k.model_limits.items()),
        priority=k.priority,
        weight=k.weight,
        model_names=frozenset(n for g in k.models if (n := _literal(g)) is not None),
        limit_names=tuple(_literal(g) for g in k.model_limits),
        id=key_id if key_id is not None else config_key_id(k.sha256),
    )


@dataclass(frozen=True, slots=True, eq=False)
class RuntimeKey:
    """A key created at runtime (admin API): its digest, its principal, and when it stops working."""

    digest: bytes
    principal: Principal
    expires_at: float = math.inf  # unix seconds


def runtime_key(k: KeyConfig, key_id: str, expires_at: float | None = None) -> RuntimeKey:
    return RuntimeKey(bytes.fromhex(k.sha256), principal_of(k, key_id), math.inf if expires_at is None else expires_at)


class Authenticator:
    def __init__(self, cfg: AuthConfig) -> None:
        self.enabled = cfg.mode == "keys"
        self._by_digest: dict[bytes, tuple[bytes, Principal]] = {}
        for k in cfg.keys:
            d = bytes.fromhex(k.sha256)
            self._by_digest[d] = (d, principal_of(k))
        self._runtime: Mapping[bytes, RuntimeKey] = {}
        #: the config keys' names: a runtime key may not take one (names are unique across both kinds)
        self.config_names = frozenset(k.name for k in cfg.keys)

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

    def principal_by_id(self, key_id: str) -> Principal | None:
        """The live key whose id this is (a config key, or a runtime key that has not expired), for work done
        later on the key's behalf (a batch's lines); None when no such key is live now."""
        if not self.enabled:
            return ANONYMOUS if key_id == ANONYMOUS.id else None
        for _, p in self._by_digest.values():
            if p.id == key_id:
                return p
        for rk in self._runtime.values():
            if rk.principal.id == key_id and rk.expires_at > time.time():
                return rk.principal
        return None

    @property
    def runtime_keys(self) -> Mapping[bytes, RuntimeKey]:
        return self._runtime

    def set_runtime_keys(self, keys: Mapping[bytes, RuntimeKey]) -> None:
        """Swap in the whole table of runtime keys (digest -> key); the caller never mutates it after."""
        self._runtime = keys

    @staticmethod
    def check_model(principal: Principal, model: str, aliases: tuple[str, ...] = ()) -> None:
        """`model` is the canonical public model (never the alias the request named), `aliases` its aliases."""
        if not principal.may_use(model, aliases):
            raise PermissionDenied(f"The key '{principal.name}' may not use the model '{model}'.", param="model")
