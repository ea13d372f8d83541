"""OTLP/HTTP's sender (observability/otlp_senders.py's HttpSender, its own HTTP/1.1 on a socket): the POST a
receiver reads (path, content type, the OTEL_* headers, gzip), one kept connection across exports, a connection
the receiver closed tried once more on a new one, an answer other than 2xx raised, and every way an answer's body
can end (content-length, chunked, the connection's close) read to its end so the next export's answer is its own
(httptools' parser, one a connection: bytes after an answer are never read as the next export's)."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from llm_gateway.observability.otlp_senders import HttpSender
from tests.support.otlp_receiver import otlp_receiver

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 2\r\n\r\nok"


class Scripted:
    """A receiver that reads each request whole and answers it with the next of `answers` (bytes, or a callable of
    the connection for what bytes cannot say: a close, or a body sent apart from its head; it returns True where the
    connection stays open); it records the requests (head, body) and the connections."""

    def __init__(self, answers: list[bytes | Callable[[socket.socket], bool]]) -> None:
        self.answers = answers
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                buf = b""
                while self.answers:
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                    if b"\r\n\r\n" not in buf:
                        break
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    self.requests.append((head, buf[:length]))
                    buf = buf[length:]
                    answer = self.answers.pop(0)
                    if callable(answer):
                        if not answer(conn):  # it closed the connection (True: it answered on it)
                            break
                        continue
                    conn.sendall(answer)

    def close(self) -> None:
        self.srv.close()
        self.thread.join(5)


@contextmanager
def scripted(*answers: bytes | Callable[[socket.socket], bool]) -> Iterator[Scripted]:
    s = Scripted(list(answers))
    try:
        yield s
    finally:
        s.close()


def close(conn: socket.socket) -> bool:
    """The receiver closes the connection without answering (a kept connection it dropped)."""
    conn.shutdown(socket.SHUT_RDWR)
    return False


def split(conn: socket.socket) -> bool:
    """An answer whose body comes after its head, in pieces: the sender must read it all before the next answer."""
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
    for _ in range(4):
        time.sleep(0.02)
        conn.sendall(b"x" * 25_000)
    return True


def test_a_batch_reaches_a_real_receiver_and_the_otel_headers_and_gzip_go_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-scope-orgid=team%201,authorization=Bearer t")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    body = pb.ExportTraceServiceRequest().SerializeToString()
    with otlp_receiver() as r:  # http.server's: an HTTP/1.0 answer that closes the connection
        s = HttpSender(r.endpoint + "/v1/traces", 5)
        s.send(body)
        s.send(body)  # on a new connection: the first one was closed by the answer
        s.close()
        assert r.requests == 2
    with scripted(OK) as srv:
        s = HttpSender(f"http://127.0.0.1:{srv.port}/v1/traces?x=1", 5)
        s.send(b"\x0a\x00" * 100)
        s.close()
    head, sent = srv.requests[0]
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/traces?x=1 HTTP/1.1"
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    assert fields[b"host"] == f"127.0.0.1:{srv.port}".encode()
    assert fields[b"content-type"] == b"application/x-protobuf"
    assert fields[b"content-encoding"] == b"gzip"
    assert fields[b"x-scope-orgid"] == b"team 1"
    assert fields[b"authorization"] == b"Bearer t"
    assert gzip.decompress(sent) == b"\x0a\x00" * 100


def test_one_connection_is_kept_across_exports_whatever_way_each_answers_body_ends() -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nt: 1\r\n\r\n"
    continued = b"HTTP/1.1 100 Continue\r\n\r\n" + OK
    empty = b"HTTP/1.1 204 No Content\r\n\r\n"
    big = 200_000 * b"\x01"  # over the size sent with its head in one sendall
    with scripted(OK, split, chunked, continued, empty, OK) as srv:
        s = HttpSender(f"http://127.0.0.1:{srv.port}", 5)
        for _ in range(5):
            s.send(b"abc")
        s.send(big)
        s.close()
    assert srv.connections == 1
    assert [b for _, b in srv.requests] == [b"abc"] * 5 + [big]
    assert srv.requests[0][0].startswith(b"POST /v1/traces HTTP/1.1\r\n")


def test_a_connection_the_receiver_closed_is_tried_once_more_on_a_new_one() -> None:
    with scripted(OK, close, OK) as srv:
        s = HttpSender(f"http://127.0.0.1:{srv.port}/v1/traces", 5)
        s.send(b"one")
        s.send(b"two")  # the kept connection is closed under it: sent again on a new one
        s.close()
    assert [b for _, b in srv.requests] == [b"one", b"two", b"two"]
    assert srv.connections == 2


def test_a_receiver_that_closes_twice_or_answers_an_error_raises_and_the_next_export_reconnects() -> None:
    error = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy"

    def no_length(conn: socket.socket) -> bool:  # the body ends with the connection
        conn.sendall(b"HTTP/1.1 500 Oops\r\nconnection: close\r\n\r\nthe body, to the close")
        conn.shutdown(socket.SHUT_RDWR)
        return False

    with scripted(close, close, error, OK, no_length, OK) as srv:
        s = HttpSender(f"http://127.0.0.1:{srv.port}/v1/traces", 5)
        with pytest.raises(OSError):
            s.send(b"a")  # closed, then closed again on the new connection
        with pytest.raises(OSError, match="503"):
            s.send(b"b")
        s.send(b"c")  # the 503's body was read: this answer is this request's
        with pytest.raises(OSError, match="500"):
            s.send(b"d")
        s.send(b"e")  # after a close: a new connection
        s.close()
    assert [b for _, b in srv.requests] == [b"a", b"a", b"b", b"c", b"d", b"e"]
    assert srv.connections == 4


def test_an_answer_with_a_length_cut_short_by_the_close_is_a_failure_not_an_answer() -> None:
    """Only an answer with neither a length nor chunks ends with the connection: a 200 whose content-length or
    chunks the close cut short is a broken connection (tried once more on a new one, then raised)."""

    def cut(head: bytes) -> Callable[[socket.socket], bool]:
        def answer(conn: socket.socket) -> bool:
            conn.sendall(head + b"0123456789")
            conn.shutdown(socket.SHUT_RDWR)
            return False

        return answer

    by_length = cut(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
    by_chunks = cut(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n64\r\n")
    with scripted(by_length, by_chunks) as srv:
        s = HttpSender(f"http://127.0.0.1:{srv.port}/v1/traces", 5)
        with pytest.raises(OSError, match="in an answer's body"):
            s.send(b"a")
        s.close()
    assert [b for _, b in srv.requests] == [b"a", b"a"]
    assert srv.connections == 2


def test_bytes_after_an_answer_are_never_taken_for_the_next_exports_answer() -> None:
    """A receiver out of step (a stale second answer behind the first, in the same write): the first is this
    export's, and its connection is not kept, so the next export's answer is its own, on a new connection."""
    stale = OK + b"HTTP/1.1 503 Stale\r\ncontent-length: 4\r\n\r\nbusy"
    with scripted(stale, OK) as srv:
        s = HttpSender(f"http://127.0.0.1:{srv.port}/v1/traces", 5)
        s.send(b"one")  # 200: not the 503 behind it
        s.send(b"two")
        s.close()
    assert [b for _, b in srv.requests] == [b"one", b"two"]
    assert srv.connections == 2


def test_a_receiver_that_is_down_raises() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    srv.close()
    s = HttpSender(f"http://127.0.0.1:{port}/v1/traces", 5)
    with pytest.raises(OSError):
        s.send(b"x")
