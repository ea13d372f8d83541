"""H4 of the red-team report: nobody without a key may hold a connection open, nor fill `max_connections`.

Each test is written from a reproduction (../shared/redteam-2026-12-04.md, H4), against a real gateway
process on loopback: an early answer (401) to a request whose body has not all arrived closes the
connection after a short linger, whatever the client sends next; the admin API answers a request without
an admin key from its headers alone (no body read first) and closes; a body that never comes to the admin
API with a good key is cut off with 408; connections that never authenticated have a cap of their own
(`server.max_unauthenticated_connections`), past which the oldest is dropped, so they never starve the
rest: `/healthz` and keyed clients still get through with many more of them parked than `max_connections`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.conftest import TEST_KEY
from tests.support.gateway_process import GatewayProcess
from tests.support.raw_http import parse

ADMIN_KEY = "sk-admin-security-0123456789abcdef"
PATIENCE_S = 12.0  # far beyond every deadline the gateway under test has (linger 2 s, header 3 s, body 3 s)
CONFIG = """
server: {{access_log: false, header_timeout_s: 3, body_timeout_s: 3, max_connections: 20,
          keepalive_timeout_s: 60, reload_poll_s: 0, data_dir: "{data}"}}
admin: {{keys: [{{name: root, sha256: "{admin_sha}"}}]}}
auth: {{mode: keys, keys: [{{name: team-a, sha256: "{key_sha}", models: ["*"]}}]}}
backends: [{{name: emu, engine: vllm, url: "{url}"}}]
models: [{{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}]
"""


def sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as emu:
        yield emu


@pytest.fixture(scope="module")
def gateway(engine: EmulatorThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("conns")
    text = CONFIG.format(data=work / "data", admin_sha=sha(ADMIN_KEY), key_sha=sha(TEST_KEY), url=engine.url)
    with GatewayProcess(text, work) as gw:
        yield gw


def read_until_closed(s: socket.socket, timeout: float) -> tuple[bytes, float | None]:
    """What the server sends, and how long after the call it closed the connection (None: still open)."""
    t0 = time.monotonic()
    out = b""
    while (left := t0 + timeout - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            b = s.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return out, time.monotonic() - t0
        if not b:
            return out, time.monotonic() - t0
        out += b
    return out, None


def read_answer(s: socket.socket, timeout: float = PATIENCE_S) -> bytes:
    """The first answer's bytes (its head and whatever of its body came with it), or b"" if none came in time."""
    s.settimeout(timeout)
    try:
        return s.recv(65536)
    except (TimeoutError, ConnectionResetError):
        return b""


def test_a_bogus_key_with_an_unfinished_body_is_answered_then_the_connection_closes(gateway: GatewayProcess) -> None:
    """park.py: 401 for a bogus key before the body ended; one more byte used to cancel the last timer."""
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bogus\r\n"
            b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{"
        )
        answer = read_answer(s)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:100]
        assert b"\r\nconnection: close\r\n" in answer.lower()
        s.sendall(b" ")
        _, closed_after = read_until_closed(s, PATIENCE_S)
    assert closed_after is not None, f"still open {PATIENCE_S:g} s after the answer"


def test_a_client_still_uploading_after_an_early_answer_reads_the_answer_then_the_connection_closes(
    gateway: GatewayProcess,
) -> None:
    # the body keeps coming, a byte a second: the close is the gateway's linger, not the client's silence
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100000\r\n\r\n{"
        )
        answer = read_answer(s)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:100]
        t0 = time.monotonic()
        closed = False
        while not closed and time.monotonic() - t0 < PATIENCE_S:
            try:
                s.sendall(b" ")
            except OSError:
                closed = True
                break
            _, after = read_until_closed(s, 1.0)
            closed = after is not None
    assert closed, f"still open {PATIENCE_S:g} s after the answer, the client trickling its body"


def test_the_admin_api_refuses_a_request_without_a_key_before_reading_its_body(gateway: GatewayProcess) -> None:
    """exhaust.py's request: POST /admin/keys, content-length 100, no body ever."""
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            b"POST /admin/keys HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
        )
        raw, closed_after = read_until_closed(s, PATIENCE_S)
    resp = parse(raw)
    assert resp is not None, "no answer: the admin API waited for a body that never came"
    assert resp.status == 401
    assert orjson.loads(resp.body)["error"]["code"] == "missing_api_key"
    assert resp.headers.get("www-authenticate") == "Bearer"
    assert closed_after is not None


def test_the_admin_api_refuses_a_wrong_key_from_the_headers_alone(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            b"POST /admin/keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-admin-wrong\r\n"
            b"content-type: application/json\r\ncontent-length: 100\r\n\r\n"
        )
        raw, closed_after = read_until_closed(s, PATIENCE_S)
    resp = parse(raw)
    assert resp is not None and resp.status == 401, raw[:200]
    assert orjson.loads(resp.body)["error"]["code"] == "invalid_api_key"
    assert b"sk-admin-wrong" not in raw
    assert closed_after is not None


def test_an_admin_body_that_never_comes_is_cut_off_with_408_even_with_the_admin_key(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            b"POST /admin/keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ADMIN_KEY.encode() + b"\r\n"
            b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{"
        )
        t0 = time.monotonic()
        raw, closed_after = read_until_closed(s, PATIENCE_S)
    resp = parse(raw)
    assert resp is not None, f"no answer within {PATIENCE_S:g} s"
    assert resp.status == 408, (resp.status, resp.body)
    assert orjson.loads(resp.body)["error"]["code"] == "request_timeout"
    assert time.monotonic() - t0 < PATIENCE_S and closed_after is not None


def test_parked_admin_requests_past_max_connections_do_not_make_healthz_answer_503(gateway: GatewayProcess) -> None:
    """exhaust.py with 30 sockets against `max_connections: 20`, each parked before its body."""
    socks = []
    try:
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", gateway.port))
            s.sendall(
                b"POST /admin/keys HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
            )
            socks.append(s)
        time.sleep(1.0)  # they are all in: parked, or already answered and closed
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=PATIENCE_S) as p:
            p.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw, _ = read_until_closed(p, PATIENCE_S)
    finally:
        for s in socks:
            s.close()
    assert raw.split(b"\r\n")[0] == b"HTTP/1.1 200 OK", raw[:100]


def test_unauthenticated_connections_past_their_cap_make_room_for_healthz_and_keyed_clients(
    gateway: GatewayProcess,
) -> None:
    """30 connections that trickle their headers (each within the header deadline's reach for a while)
    against `max_connections: 20`: they never fill it; a probe and a keyed client still get answers."""
    socks: list[socket.socket] = []
    try:
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", gateway.port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
            socks.append(s)
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=PATIENCE_S) as p:
            p.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            health, _ = read_until_closed(p, PATIENCE_S)
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=PATIENCE_S) as c:
            c.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
                + TEST_KEY.encode()
                + b"\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
                + body
            )
            chat, _ = read_until_closed(c, PATIENCE_S)
    finally:
        for s in socks:
            s.close()
    assert health.split(b"\r\n")[0] == b"HTTP/1.1 200 OK", health[:100]
    assert chat.split(b"\r\n")[0] == b"HTTP/1.1 200 OK", chat[:300]
