"""Slow and hostile clients: trickled headers and bodies are cut off on time, oversized headers and
bodies are refused, open connections are capped; and none of it stops normal clients being served."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess, http_status
from tests.support.raw_http import exchange, parse, request_bytes

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as emu:
        cfg = f"""
server: {{access_log: false, header_timeout_s: 1, body_timeout_s: 1, max_header_bytes: 8192,
          max_body_bytes: 65536, max_connections: 40}}
auth: {{mode: none}}
backends: [{{name: emu, engine: vllm, url: "{emu.url}"}}]
models: [{{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}]
"""
        with GatewayProcess(cfg, tmp_path_factory.mktemp("hostile")) as gw:
            yield gw


def _read_all(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def _envelope(raw: bytes, status: int, code: str) -> None:
    resp = parse(raw)
    assert resp is not None, raw[:200]
    assert resp.status == status, (resp.status, resp.body)
    assert orjson.loads(resp.body)["error"]["code"] == code


def test_a_client_trickling_its_headers_is_cut_off_with_408(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        t = time.monotonic()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        for _ in range(3):
            time.sleep(0.4)
            try:
                s.sendall(b"x-slow: 1\r\n")
            except OSError:
                break
        raw = _read_all(s, 5)
        took = time.monotonic() - t
    _envelope(raw, 408, "request_timeout")
    assert took < 3


def test_an_idle_connection_that_never_sends_a_request_is_closed(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        t = time.monotonic()
        assert _read_all(s, 5) == b""
        assert time.monotonic() - t < 3


def test_a_client_trickling_its_body_is_cut_off_with_408(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            request_bytes(
                "POST", "/v1/chat/completions", {"content-type": "application/json"}, b"", content_length=str(len(CHAT))
            )
            + CHAT[:10]
        )
        t = time.monotonic()
        raw = _read_all(s, 5)
        took = time.monotonic() - t
    _envelope(raw, 408, "request_timeout")
    assert took < 3


def test_oversized_headers_are_refused_with_431(gateway: GatewayProcess) -> None:
    raw = request_bytes("GET", "/v1/models", {"x-big": "a" * 20_000})
    resp = exchange(gateway.port, raw)
    assert resp is not None and resp.status == 431
    assert orjson.loads(resp.body)["error"]["code"] == "request_header_fields_too_large"


def test_an_oversized_body_is_refused_with_413_before_it_is_read(gateway: GatewayProcess) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        # announce 10 MB, send only the headers: the answer must not wait for the body
        s.sendall(
            request_bytes(
                "POST",
                "/v1/chat/completions",
                {"content-type": "application/json"},
                b"",
                content_length=str(10_000_000),
            )
        )
        raw = _read_all(s, 3)
    _envelope(raw, 413, "request_too_large")


def test_open_connections_are_capped_and_normal_clients_still_get_through_after(gateway: GatewayProcess) -> None:
    socks = []
    try:
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", gateway.port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # never finished
            socks.append(s)
        refused = 0
        for s in socks:
            s.settimeout(0.3)
            try:
                data = s.recv(4096)
            except TimeoutError:
                continue
            if data.startswith(b"HTTP/1.1 503"):
                refused += 1
        assert refused >= 15  # everything past the cap of 40 was refused at once
    finally:
        for s in socks:
            s.close()
    time.sleep(0.3)
    assert http_status(gateway.url + "/healthz") == 200
    ok = exchange(
        gateway.port, request_bytes("POST", "/v1/chat/completions", {"content-type": "application/json"}, CHAT)
    )
    assert ok is not None and ok.status == 200


def test_a_refused_request_with_a_big_body_still_gets_its_answer_not_a_reset(gateway: GatewayProcess) -> None:
    # the parser refuses the header at once; the client is still sending 12 MB: the gateway reads and
    # discards them for a moment (lingering close) so the client reads the 400 instead of a reset
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 12_000_000 + b'"}]}'
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(
            request_bytes(
                "POST", "/v1/chat/completions", {"content-type": "\x01bad"}, b"", content_length=str(len(body))
            )
        )
        s.sendall(body)  # a reset here would raise
        raw = _read_all(s, 5)
    _envelope(raw, 400, "invalid_http")
