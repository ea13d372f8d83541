"""The requests that check a target answers before it is measured: `post` (one chat completion from
request.json), `smoke` (a whole and a streamed answer) and `dialect_smoke` (one short stream in
Anthropic's or OpenAI Responses' dialect, checked as the stream client checks one, so that a missing
endpoint is reported instead of timing a stream of 404s) and `body_smoke` (one whole answer to a request
file, e.g. the agent-sized request, before it is timed).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import procstat as ps
import stream_client as sc
import targets as tg
from run_context import BENCH


def post(base: str, changes: dict, timeout: float = 30) -> tuple[int, bytes]:
    body = json.loads((BENCH / "request.json").read_bytes())
    body.update(changes)
    hdrs = {"Content-Type": "application/json", "Authorization": "Bearer " + tg.API_KEY}
    return ps.http(base + "/v1/chat/completions", json.dumps(body).encode(), hdrs, timeout)


def dialect_smoke(url: str, dialect: str, tokens: int = 8) -> str | None:
    """One short stream in `dialect`, read whole and checked as the stream client checks one: None if it
    is good, else why not (status and the start of the body: a 404 says the endpoint is not there)."""
    chat = json.loads((BENCH / "request.json").read_bytes())
    body = json.dumps(sc.dialect_body(chat, dialect, tokens)).encode()
    req = urllib.request.Request(url, body, sc.request_headers(dialect, tg.API_KEY))
    path = "/" + url.split("/", 3)[3]
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            msg = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = raw[:200].decode(errors="replace")
        return f"POST {path} answered {e.code}: {msg}"
    except OSError as e:
        return f"POST {path} failed: {type(e).__name__}: {e}"
    sse = sc.SSEReader(dialect)
    sse.feed(raw)
    kind = sse.finish()
    if status != 200 or kind or sse.deltas != tokens:
        got = f"{kind or 'ok'}, {sse.deltas} token deltas for {tokens}"
        return f"POST {path} answered {status} ({got}): {raw[-200:].decode(errors='replace')}"
    return None


def body_smoke(url: str, body: Path) -> str | None:
    """One POST of the request file `body` as it is (whole answer, Bearer key): None if it answers 200 with
    JSON, else why not (so a body the target refuses is reported instead of timed)."""
    hdrs = {"Content-Type": "application/json", "Authorization": "Bearer " + tg.API_KEY}
    path = "/" + url.split("/", 3)[3]
    try:
        status, raw = ps.http(url, body.read_bytes(), hdrs, 30)
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except OSError as e:
        return f"POST {path} ({body.name}) failed: {type(e).__name__}: {e}"
    if status != 200:
        return f"POST {path} ({body.name}) answered {status}: {raw[:300].decode(errors='replace')}"
    try:
        json.loads(raw)
    except ValueError:
        return f"POST {path} ({body.name}) answered 200 with no JSON: {raw[:200].decode(errors='replace')}"
    return None


def smoke(base: str) -> str:
    st, raw = post(base, {"stream": False})
    j = json.loads(raw)
    if st != 200 or not j["choices"][0]["message"]["content"] or not j.get("usage"):
        raise RuntimeError(f"non-streaming smoke request failed: {st} {raw[:300]!r}")
    st, raw = post(base, {"stream": True, "max_tokens": 8})
    if st != 200 or b"data: [DONE]" not in raw:
        raise RuntimeError(f"streaming smoke request failed: {st} {raw[-300:]!r}")
    return f"non-stream ok, stream ok ({raw.count(b'data:')} SSE events for 8 tokens)"
