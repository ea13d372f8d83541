"""The bare floor: an aiohttp server in front of one aiohttp client session, on uvloop, with no features.

What a Python proxy costs when it does nothing but relay: no auth, no limits, no metrics, no body parsing
(the request bytes go upstream as they came, the answer's bytes come back as they came; a streamed answer
is relayed chunk by chunk as the engine wrote it). One `ClientSession` with an unbounded keep-alive pool.
The issue's table calls this row "aiohttp server + client, bare". Env: UPSTREAM_URL (the engine), PORT.
Runs with the project's venv (aiohttp, uvloop).
"""

from __future__ import annotations

import os

import aiohttp
import uvloop
from aiohttp import web

UPSTREAM = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:9100")
SESSION = web.AppKey("session", aiohttp.ClientSession)


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    hdrs = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    session = request.app[SESSION]
    async with session.request(request.method, UPSTREAM + request.path_qs, data=body, headers=hdrs) as up:
        ctype = up.headers.get("Content-Type", "application/json")
        if not ctype.startswith("text/event-stream"):
            return web.Response(body=await up.read(), status=up.status, headers={"Content-Type": ctype})
        out = web.StreamResponse(status=up.status, headers={"Content-Type": ctype, "Cache-Control": "no-cache"})
        await out.prepare(request)
        async for chunk in up.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out


async def make_app() -> web.Application:
    app = web.Application()

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        app[SESSION] = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))
        yield
        await app[SESSION].close()

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


if __name__ == "__main__":
    uvloop.install()
    web.run_app(make_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8102")), access_log=None, print=None)
