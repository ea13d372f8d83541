"""Applying a key's limits to one request: which scopes, the store-outage policy, the headers.

A key's own limits form one scope; a matching `model_limits` entry adds a second (key and model).
Scopes are named by the key's id (`Principal.id`), never its name: a new key that takes a deleted key's
name starts with fresh windows and budgets. A `model_limits` entry matches the canonical public model, or
names one of its aliases (`aliases`, public model -> its aliases, from the config).
`admit` reserves in the store (or raises `RateLimited` / `ServiceUnavailable`), `finish` settles. A
generation may be admitted smaller than it asked when a budget has less room (`flexible`: see
store.py's `Shrink`); its `Reservation.tokens` is then what the service holds the engine to.
Requests that generate nothing still count against the key's requests per minute: token counting
(`admit_requests`: rpm and concurrency, never tokens or budgets), and requests refused before they
were admitted, for a bad body, an unknown or forbidden model (`meter_refused`: rpm only), so that a
flood of bad requests is limited like any other.
Headers (`Limiter.quota_headers`) follow OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}; a key
with a budget also gets x-ratelimit-{limit,remaining}-budget-{tokens,cost} and x-ratelimit-reset-budget. A spent
budget is 429 `insufficient_quota` (OpenAI's type and code for it), with Retry-After at the period's end (UTC).
Cost is priced by the public model's `price` (per million input/output tokens): reserved at the prompt
estimate and `max_tokens`, settled with the real usage; a model without a price costs nothing.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping

from llm_gateway.access.keys import Principal
from llm_gateway.access.store import (
    COST_UNITS,
    Decision,
    InlineStore,
    LimitStore,
    Quota,
    Reservation,
    ScopeLimits,
    Shrink,
    StoreUnavailable,
    cost_units,
    format_reset,
    key_scope,
    model_scope,
    money,
    token_cost,
    utc_text,
)
from llm_gateway.errors import RateLimited, ServiceUnavailable
from llm_gateway.exchange import Headers
from llm_gateway.settings import Limits, Price


class Limiter:
    def __init__(
        self,
        store: LimitStore,
        *,
        fail_open: bool,
        on_reject: Callable[[str, str], None] | None = None,
        on_store_error: Callable[[], None] | None = None,
        lease_s: float = 3600.0,
        prices: Mapping[str, Price] | None = None,
        aliases: Mapping[str, tuple[str, ...]] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        #: settlements never suspend (an in-process store, `InlineStore`): `finish` needs no shield; checked
        #: once, here, and its answers then had without a coroutine (`reserve_now`, `finish_now`)
        inline = store if isinstance(store, InlineStore) else None
        self.inline = inline is not None
        self._reserve_now = inline.reserve_now if inline is not None else None
        self._finish_now = inline.finish_now if inline is not None else None
        # public model -> (input, output) per million tokens, for cost budgets
        self._prices = {m: (p.input_per_million, p.output_per_million) for m, p in (prices or {}).items()}
        self._wall = wall
        self._aliases = dict(aliases or {})
        self._fail_open = fail_open
        self._on_reject = on_reject
        self._on_store_error = on_store_error
        self._lease_s = lease_s
        # keyed by the Principal itself (hashed by identity, kept alive by the key), never by id()
        self._scopes: dict[tuple[Principal, str], tuple[ScopeLimits, ...]] = {}
        #: the same scopes for requests that generate nothing: rpm and concurrency only
        self._request_scopes: dict[tuple[Principal, str], tuple[ScopeLimits, ...]] = {}
        #: a key's own requests-per-minute alone, for requests refused before admission
        self._rpm_scopes: dict[Principal, tuple[ScopeLimits, ...]] = {}
        #: cost limits (COST_UNITS) -> their x-ratelimit-limit-budget-cost text: a key's limit is the same on every
        #: answer, its text made once (at most 4096 kept; a reload's new Limiter starts empty)
        self._cost_limits: dict[int, bytes] = {}

    def scopes(self, who: Principal, model: str) -> tuple[ScopeLimits, ...]:
        key = (who, model)
        found = self._scopes.get(key)
        if found is None:
            out = []
            lim = who.limits
            if _limited(lim):
                out.append(self._scope(key_scope(who.id), lim))
            ml = who.limits_for(model, self._aliases.get(model, ()))
            if ml is not None and _limited(ml):
                out.append(self._scope(model_scope(who.id, model), ml))
            found = tuple(out)
            if len(self._scopes) < 100_000:
                self._scopes[key] = found
        return found

    def _scope(self, name: str, lim: Limits) -> ScopeLimits:
        b = lim.budget
        if b is None:
            return ScopeLimits(name, lim.rpm, lim.tpm, lim.concurrency, self._lease_s)
        cost = None if b.cost is None else cost_units(b.cost)
        return ScopeLimits(name, lim.rpm, lim.tpm, lim.concurrency, self._lease_s, b.tokens, cost, b.period)

    def counts_tokens(self, scopes: tuple[ScopeLimits, ...]) -> bool:
        """Does one of these scopes count tokens (tpm or a budget)? Then a generation is held to its reservation."""
        return any(s.tpm is not None or s.has_budget for s in scopes)

    async def admit(
        self,
        who: Principal,
        model: str,
        tokens: int,
        rid: str,
        *,
        prompt_tokens: int | None = None,
        choices: int = 1,
        flexible: bool = False,
    ) -> tuple[Decision | None, Reservation | None]:
        """Reserve `tokens` (the prompt estimate plus max_tokens for each of `choices`) in every scope of
        the key; with a cost budget, `prompt_tokens` (the prompt estimate) prices the two parts apart
        (without it, all of `tokens` is priced at the dearer rate). `flexible` (a generation, with
        `prompt_tokens`): a budget with less room grants less, whole tokens per choice (the reservation's
        `tokens`); refused only when not even the prompt and a token per choice fit."""
        scopes = self.scopes(who, model)
        if not scopes:
            return None, None
        price = self._prices.get(model)
        cost = 0
        budgeted = costed = False
        for s in scopes:  # (loops, not any() over generators: every request asks)
            if s.budget_cost is not None:
                budgeted = costed = True
            elif s.budget_tokens is not None:
                budgeted = True
        if price is not None and costed:
            if prompt_tokens is None:
                cost = _dearer(price, tokens)
            else:
                prompt = prompt_tokens if prompt_tokens < tokens else tokens
                cost = token_cost(price, prompt, tokens - prompt)
        shrink: Shrink | None = None
        if flexible and prompt_tokens is not None and budgeted:
            prompt = prompt_tokens if prompt_tokens < tokens else tokens
            shrink = Shrink(
                prompt,
                choices if choices > 1 else 1,
                token_cost(price, prompt, 0) if price is not None else 0,
                price[1] * COST_UNITS / 1_000_000 if price is not None else 0.0,
            )
        return await self._reserve(who, scopes, tokens, cost, rid, shrink, price, prompt_tokens)

    async def admit_requests(self, who: Principal, model: str, rid: str) -> tuple[Decision | None, Reservation | None]:
        """A request that generates nothing (token counting): one request per minute and a concurrency
        lease in the key's scopes, no tokens and no budget. Settle it with `finish(res, 0)`."""
        key = (who, model)
        scopes = self._request_scopes.get(key)
        if scopes is None:
            scopes = tuple(
                ScopeLimits(s.scope, s.rpm, None, s.concurrency, s.lease_s)
                for s in self.scopes(who, model)
                if s.rpm is not None or s.concurrency is not None
            )
            if len(self._request_scopes) < 100_000:
                self._request_scopes[key] = scopes
        if not scopes:
            return None, None
        return await self._reserve(who, scopes, 0, 0, rid, None, None, None)

    async def meter_refused(self, who: Principal, rid: str) -> None:
        """A request of `who` refused before admission (bad body, unknown or forbidden model) is one
        request against the key's own requests per minute: raises `RateLimited` once they are spent (the
        refusal then is that 429), else returns (the refusal stands). Nothing is held: no settlement."""
        scopes = self._rpm_scopes.get(who)
        if scopes is None:
            rpm = who.limits.rpm
            scopes = () if rpm is None else (ScopeLimits(key_scope(who.id), rpm, None, None, self._lease_s),)
            if len(self._rpm_scopes) < 100_000:
                self._rpm_scopes[who] = scopes
        if scopes:
            with contextlib.suppress(ServiceUnavailable):  # a store outage does not turn the refusal into a 503
                await self._reserve(who, scopes, 0, 0, rid, None, None, None)

    async def _reserve(
        self,
        who: Principal,
        scopes: tuple[ScopeLimits, ...],
        tokens: int,
        cost: int,
        rid: str,
        shrink: Shrink | None,
        price: tuple[float, float] | None,
        prompt_tokens: int | None,
    ) -> tuple[Decision | None, Reservation | None]:
        reserve_now = self._reserve_now
        try:
            if reserve_now is not None:
                args = (rid, scopes, tokens, cost) if shrink is None else (rid, scopes, tokens, cost, shrink)
                decision, res = reserve_now(*args)
            elif shrink is not None:
                decision, res = await self.store.reserve(rid, scopes, tokens, cost, shrink)
            elif cost:
                decision, res = await self.store.reserve(rid, scopes, tokens, cost)
            else:
                decision, res = await self.store.reserve(rid, scopes, tokens)
        except StoreUnavailable:
            if self._on_store_error:
                self._on_store_error()
            if self._fail_open:
                return None, None
            raise ServiceUnavailable(
                "The rate-limit store is unavailable and this gateway is configured to refuse requests "
                "until it is back.",
                code="limits_unavailable",
                headers={"retry-after": "1"},
            ) from None
        if not decision.allowed:
            kind = decision.kind or "requests"
            if self._on_reject:
                self._on_reject(who.name, kind)
            headers = {"retry-after": str(max(1, math.ceil(decision.retry_after_s)))}
            for name, value in self.quota_headers(decision):
                headers[name.decode()] = value.decode()
            if kind == "budget":
                resets = utc_text(round(self._wall() + decision.retry_after_s))  # periods end on whole seconds
                raise RateLimited(
                    f"{decision.message} (key '{who.name}'). The budget resets at {resets} "
                    f"(in {headers['retry-after']}s).",
                    type_="insufficient_quota",
                    code="insufficient_quota",
                    headers=headers,
                )
            raise RateLimited(
                f"{decision.message} (key '{who.name}'). Retry after {headers['retry-after']}s.",
                type_="tokens" if kind == "tokens" else "requests",
                headers=headers,
            )
        if res.cost:
            res.price, res.prompt_estimate = price, prompt_tokens
        return decision, res

    def quota_headers(self, d: Decision | None) -> Headers:
        """The x-ratelimit-* headers of a decision (none without one)."""
        if d is None:
            return []
        out: Headers = []
        _add(out, b"requests", d.requests)
        _add(out, b"tokens", d.tokens)
        bt, bc = d.budget_tokens, d.budget_cost
        if bt is not None:
            left = bt.remaining
            out.append((b"x-ratelimit-limit-budget-tokens", str(bt.limit).encode()))
            out.append((b"x-ratelimit-remaining-budget-tokens", str(left if left > 0 else 0).encode()))
        if bc is not None:
            left = bc.remaining
            texts = self._cost_limits
            limit = texts.get(bc.limit)
            if limit is None:
                limit = money(bc.limit).encode()
                if len(texts) < 4096:
                    texts[bc.limit] = limit
            out.append((b"x-ratelimit-limit-budget-cost", limit))
            out.append((b"x-ratelimit-remaining-budget-cost", money(left if left > 0 else 0).encode()))
        reset = bt or bc
        if reset is not None:
            out.append((b"x-ratelimit-reset-budget", format_reset(reset.reset_s).encode()))
        return out

    async def finish(
        self, res: Reservation | None, actual_tokens: int | None, *, prompt_tokens: int | None = None
    ) -> None:
        """Settle with the real total (None: keep the estimate); with a cost budget, `prompt_tokens`
        (the real prompt) prices the settlement exactly (without it: the prompt estimate of `admit`)."""
        if res is None or not res.active:
            return
        if res.price is None or actual_tokens is None:
            if self._finish_now is not None:
                self._finish_now(res, actual_tokens)
            else:
                await self.store.finish(res, actual_tokens)
            return
        prompt = prompt_tokens if prompt_tokens is not None else res.prompt_estimate
        if prompt is None:  # no split known: the dearer rate, as reserved
            cost = _dearer(res.price, actual_tokens)
        else:
            if prompt > actual_tokens:
                prompt = actual_tokens
            cost = token_cost(res.price, prompt, actual_tokens - prompt)
        if self._finish_now is not None:
            self._finish_now(res, actual_tokens, cost)
        else:
            await self.store.finish(res, actual_tokens, cost)


def _dearer(price: tuple[float, float], tokens: int) -> int:
    """`tokens` priced at the dearer of the two rates: an upper bound when the split is unknown."""
    return token_cost(price, 0, tokens) if price[1] >= price[0] else token_cost(price, tokens, 0)


def _limited(lim: Limits) -> bool:
    return lim.rpm is not None or lim.tpm is not None or lim.concurrency is not None or lim.budget is not None


#: the three x-ratelimit-* header names of each dimension, made once
_NAMES = {
    what: (b"x-ratelimit-limit-" + what, b"x-ratelimit-remaining-" + what, b"x-ratelimit-reset-" + what)
    for what in (b"requests", b"tokens")
}


def _add(out: Headers, what: bytes, q: Quota | None) -> None:
    if q is None:
        return
    limit, remaining, reset = _NAMES[what]
    out.append((limit, str(q.limit).encode()))
    out.append((remaining, str(max(0, q.remaining)).encode()))
    out.append((reset, format_reset(q.reset_s).encode()))
