"""The status page: `/status` (an HTML shell, public) and `/admin/status.json` (its data, admin key only).

The page is served by the gateway itself, one document with its CSS and JavaScript inline (no CDN, no
other request than its data), so it works offline. It asks for an admin key once, keeps it in the tab's
`sessionStorage` (gone when the tab closes, never in a URL, a cookie or a log), and fetches
`/admin/status.json` every `REFRESH_S` seconds with it as `Authorization: Bearer`. It shows the backends
(state, engine load, in-flight, breakers), the models with their deployments, the deployments' wait
queues, the last errors (codes only: a client's message or prompt never reaches it) and tokens per key
over the last hour (one-minute buckets in memory, llm_gateway/observability/ledger.py). Everything it
shows is rendered as text (`textContent`), never as HTML, and a Content-Security-Policy allows only the
page's own inline script and style (by hash) and requests to the gateway itself.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response

from llm_gateway.admin.context import AdminContext, admin_context
from llm_gateway.admin.security import AdminUser
from llm_gateway.routing.breaker import STATE_VALUE

REFRESH_S = 3
STATUS_PATH = "/status"  # the page; its data is /admin/status.json
#: the routes under the admin prefix (/admin/status.json, and the page again at /admin/status)
router = APIRouter(tags=["status"])
#: the page at the top level, /status (included without the prefix)
page = APIRouter(tags=["status"])
Ctx = Annotated[AdminContext, Depends(admin_context)]


@router.get("/status.json", summary="What the status page shows: backends, models, queues, errors, tokens per key")
async def status_json(admin: AdminUser, ctx: Ctx) -> Response:
    return Response(orjson.dumps(snapshot(ctx)), media_type="application/json", headers={"cache-control": "no-store"})


def snapshot(ctx: AdminContext) -> dict[str, Any]:
    gw = ctx.gw
    table = gw.runtime.table
    now_mono = time.monotonic()
    now = ctx.clock()
    backends = []
    open_breakers: dict[str, int] = {}
    for m in table.models:
        for d in m.deployments:
            if d.breaker.state != "closed":
                open_breakers[d.backend.name] = open_breakers.get(d.backend.name, 0) + 1
    for b in table.backends.values():
        load = b.load
        backends.append(
            {
                "name": b.name,
                "engine": b.kind,
                "state": b.health(now_mono),
                "detail": b.detail[:200],
                "in_flight": b.in_flight,
                "capacity": b.cfg.capacity,
                "managed": b.managed.describe() if b.managed is not None else None,  # routing/managed.py
                "lora": b.loras.describe() if b.loras.held else None,  # its engine's LoRA adapters (routing/lora.py)
                "load": None
                if load is None
                else {
                    "running": load.running,
                    "waiting": load.waiting,
                    "kv_cache": load.kv,
                    "age_s": round(now_mono - load.at, 1),
                },
                "breakers_not_closed": open_breakers.get(b.name, 0),
            }
        )
    models = []
    queues = []
    for m in table.models:
        deps = []
        for d in m.deployments:
            a = d.admission
            dep = {
                "backend": d.backend.name,
                "upstream_model": d.upstream_model,
                "format": d.cfg.format,
                "breaker": d.breaker.state,
                "breaker_value": STATE_VALUE[d.breaker.state],
                "in_flight": a.in_flight,
                "max_concurrency": a.limit,
                "queued": a.queued,
                "max_queue": a.max_queue,
            }
            deps.append(dep)
            if a.limit is not None or a.queued:
                queues.append({"model": m.name, **dep})
        models.append({"name": m.name, "aliases": list(m.cfg.aliases), "strategy": m.cfg.strategy, "deployments": deps})
    usage = gw.usage
    return {
        "object": "status",
        "now": round(now, 3),
        "refresh_s": REFRESH_S,
        "backends": backends,
        "models": models,
        "queues": queues,
        "recent_errors": usage.activity.recent_errors(),
        "tokens_by_key": usage.activity.tokens_by_key(now),
        "ledger": {"enabled": usage.enabled, "buffered": usage.buffered},
    }


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:16px;align-items:baseline}
header h1{font-size:17px;margin:0}#updated{opacity:.8;font-size:12px}
main{padding:12px 18px;display:grid;gap:14px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 14px;overflow-x:auto}
h2{font-size:15px;margin:0 0 8px}table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eef0f3;font-variant-numeric:tabular-nums}
th{font-weight:600;color:#5a6272;font-size:12px}
.s-ready,.s-closed{color:#137333}.s-busy,.s-half_open{color:#b06000}
.s-down,.s-open,.s-loading{color:#c5221f}.s-unknown{color:#5a6272}
.muted{color:#5a6272}#banner{padding:8px 18px;background:#fce8e6;color:#a50e0e;display:none}
#login{max-width:420px;margin:40px auto;background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:18px}
#login input{width:100%;box-sizing:border-box;padding:6px;margin:8px 0;font:inherit}
button{font:inherit;padding:5px 12px}.bar{display:inline-block;width:3px;background:#4a7bd0;margin-right:1px}
.spark{display:inline-flex;align-items:flex-end;height:20px}
"""

_SCRIPT = """
"use strict";
const KEY = "llm-gateway-admin-key";
const REFRESH_MS = @REFRESH_MS@;
const $ = (id) => document.getElementById(id);
let timer = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function table(id, heads, rows) {
  const t = $(id);
  t.replaceChildren();
  const hr = el("tr");
  for (const h of heads) hr.appendChild(el("th", h));
  t.appendChild(hr);
  if (rows.length === 0) {
    const tr = el("tr"), td = el("td", "none", "muted");
    td.colSpan = heads.length;
    tr.appendChild(td);
    t.appendChild(tr);
  }
  for (const r of rows) {
    const tr = el("tr");
    for (const c of r) {
      if (c instanceof Node) { const td = el("td"); td.appendChild(c); tr.appendChild(td); }
      else tr.appendChild(el("td", c === null || c === undefined ? "-" : c));
    }
    t.appendChild(tr);
  }
}
const state = (s) => el("span", s, "s-" + s);
const num = (v, d) => (v === null || v === undefined ? "-" : (d ? Number(v).toFixed(d) : String(v)));
function spark(values) {
  const box = el("span", null, "spark"), max = Math.max(1, ...values);
  for (const v of values) {
    const b = el("span", null, "bar");
    b.style.height = Math.round((v / max) * 20) + "px";
    box.appendChild(b);
  }
  return box;
}
function render(s) {
  table("backends", ["backend", "engine", "state", "in flight", "capacity", "engine running", "engine waiting",
                     "KV cache", "load age s", "breakers not closed", "detail"],
    s.backends.map((b) => [b.name, b.engine, state(b.state), b.in_flight, b.capacity,
      num(b.load && b.load.running), num(b.load && b.load.waiting), num(b.load && b.load.kv_cache, 2),
      num(b.load && b.load.age_s), b.breakers_not_closed, b.detail || ""]));
  const mrows = [];
  for (const m of s.models) for (const d of m.deployments)
    mrows.push([m.name + (m.aliases.length ? " (" + m.aliases.join(", ") + ")" : ""), m.strategy, d.backend,
      d.upstream_model, d.format, state(d.breaker), d.in_flight]);
  table("models", ["model", "strategy", "backend", "upstream model", "format", "breaker", "in flight"], mrows);
  table("queues", ["model", "backend", "in flight", "max concurrency", "queued", "max queue"],
    s.queues.map((q) => [q.model, q.backend, q.in_flight, q.max_concurrency, q.queued, q.max_queue]));
  table("errors", ["time", "status", "outcome", "error", "key", "model", "backend", "request id"],
    s.recent_errors.map((e) => [new Date(e.at * 1000).toISOString().slice(11, 19), e.status, e.outcome,
      e.error, e.key, e.model, e.backend, e.request_id]));
  table("tokens", ["key", "requests", "prompt", "completion", "total", "per minute (last hour)"],
    s.tokens_by_key.map((k) => [k.key, k.requests, k.prompt_tokens, k.completion_tokens, k.total_tokens,
      spark(k.per_minute)]));
  $("updated").textContent = "updated " + new Date(s.now * 1000).toISOString().slice(0, 19).replace("T", " ") + " UTC";
  $("ledger").textContent = s.ledger.enabled ? s.ledger.buffered + " ledger rows waiting to be written" : "ledger off";
}
function banner(text) { const b = $("banner"); b.textContent = text || ""; b.style.display = text ? "block" : "none"; }
function showLogin(message) {
  if (timer) { clearInterval(timer); timer = null; }
  $("app").hidden = true; $("login").hidden = false; $("login-message").textContent = message || "";
  document.body.dataset.state = "login";
}
async function refresh() {
  const key = sessionStorage.getItem(KEY);
  if (!key) { showLogin(); return; }
  let r;
  try {
    r = await fetch("/admin/status.json", {headers: {"Authorization": "Bearer " + key}, cache: "no-store"});
  } catch (e) {
    banner("The gateway cannot be reached; retrying.");
    document.body.dataset.state = "unreachable";
    return;
  }
  if (r.status === 401 || r.status === 403) {
    sessionStorage.removeItem(KEY);
    showLogin("That admin key was refused.");
    return;
  }
  if (!r.ok) {
    banner("The gateway answered " + r.status + "; retrying.");
    document.body.dataset.state = "error";
    return;
  }
  render(await r.json());
  banner("");
  document.body.dataset.state = "ok";
}
function start() {
  $("login").hidden = true; $("app").hidden = false;
  refresh();
  if (!timer) timer = setInterval(refresh, REFRESH_MS);
}
$("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const v = $("key").value.trim();
  if (!v) return;
  sessionStorage.setItem(KEY, v);
  $("key").value = "";
  start();
});
$("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY); showLogin(); });
if (sessionStorage.getItem(KEY)) start(); else showLogin();
""".replace("@REFRESH_MS@", str(REFRESH_S * 1000))

_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<link rel="icon" href="data:,">
<title>llm-gateway status</title>
<style>@STYLE@</style>
</head><body data-state="loading">
<header><h1>llm-gateway status</h1><span id="updated"></span><span id="ledger" class="muted"></span></header>
<div id="banner" role="alert"></div>
<form id="login" hidden>
  <label for="key">Admin key (kept in this tab only)</label>
  <input id="key" name="key" type="password" autocomplete="off" spellcheck="false">
  <button id="show" type="submit">Show status</button>
  <p id="login-message" class="muted"></p>
</form>
<main id="app" hidden>
  <div><button id="logout" type="button">Forget the key</button></div>
  <section><h2>Backends</h2><table id="backends"></table></section>
  <section><h2>Models and deployments</h2><table id="models"></table></section>
  <section><h2>Queues</h2><table id="queues"></table></section>
  <section><h2>Recent errors</h2><table id="errors"></table></section>
  <section><h2>Tokens per key, last hour</h2><table id="tokens"></table></section>
</main>
<script>@SCRIPT@</script>
</body></html>
""".replace("@STYLE@", _STYLE).replace("@SCRIPT@", _SCRIPT)


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# the page's own inline script and style only (by hash), requests to the gateway only, never framed
CSP = (
    f"default-src 'none'; script-src {_sha256(_SCRIPT)}; style-src {_sha256(_STYLE)}; connect-src 'self'; "
    "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "content-security-policy": CSP,
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


async def _page() -> HTMLResponse:
    return HTMLResponse(_HTML, headers=PAGE_HEADERS)


page.add_api_route(STATUS_PATH, _page, methods=["GET"], summary="The status page (HTML; its data needs an admin key)")
router.add_api_route(STATUS_PATH, _page, methods=["GET"], summary="The status page again, under /admin")
