"""The naive baseline: FastAPI + httpx.AsyncClient, written the way most people write a proxy.

What `pip install fastapi uvicorn httpx` gives with plain defaults: the asyncio loop, the h11 parser,
the stdlib json module, httpx's default pool (100 connections, 20 kept alive), the body parsed and
re-serialised. No auth, no limits, no metrics. Env: UPSTREAM_URL (the engine), PORT.
"""

import os

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

UPSTREAM = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:9100")
app = FastAPI()
client = httpx.AsyncClient(base_url=UPSTREAM, timeout=60.0)


@app.post("/v1/chat/completions")
async def chat_completions(request: Request):
    body = await request.json()
    if body.get("stream"):
        upstream = await client.send(client.build_request("POST", "/v1/chat/completions", json=body), stream=True)

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), status_code=upstream.status_code, media_type="text/event-stream")
    r = await client.post("/v1/chat/completions", json=body)
    return JSONResponse(r.json(), status_code=r.status_code)


@app.get("/v1/models")
async def models():
    r = await client.get("/v1/models")
    return JSONResponse(r.json(), status_code=r.status_code)


if __name__ == "__main__":
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(os.environ.get("PORT", "8101")),
        loop="asyncio",
        http="h11",
        access_log=False,
        log_level="warning",
    )
