"""H4 under load: 200 unauthenticated slow connections against `max_connections: 100`, while a keyed
client's requests all succeed.

A real gateway process on loopback. The attackers trickle their headers a byte at a time, slower than a
request could ever finish but inside the header deadline (set long here, so the deadline is not what saves
the keyed client), and reconnect whenever the gateway drops one of them, a slot at a time after a short
pause: bounded in count and in time. The keyed client calls through the openai SDK (its kept-alive
connection) and, to face the attackers on every call, also on a new connection per request. Before the fix
the first 100 slow connections held every slot and the keyed client got 503 on every new connection; now
the unauthenticated ones are held to `max_unauthenticated_connections` (50 here, half the cap) and the
oldest is dropped for each newcomer.
"""

from __future__ import annotations

import hashlib
import select
import socket
import threading
import time
from collections.abc import Iterator

import openai
import orjson
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.conftest import TEST_KEY
from tests.support.gateway_process import GatewayProcess, http_status
from tests.support.raw_http import exchange, request_bytes

ATTACKERS = 200
MAX_CONNECTIONS = 100
RECONNECT_PAUSE_S = 0.5  # a dropped attacker's slot waits this long before it connects again
MAX_RECONNECTS = 4000  # bound on the attackers' connections in all
ATTACK_FOR_S = 60.0  # hard bound on the attack, whatever the client does
KEYED_CALLS = 20
CONFIG = f"""
server: {{access_log: false, header_timeout_s: 60, body_timeout_s: 10, keepalive_timeout_s: 60,
          max_connections: {MAX_CONNECTIONS}, reload_poll_s: 0}}
auth: {{mode: keys, keys: [{{name: team-a, sha256: "{hashlib.sha256(TEST_KEY.encode()).hexdigest()}", models: ["*"]}}]}}
backends: [{{name: emu, engine: vllm, url: "{{url}}"}}]
models: [{{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}]
"""
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class SlowAttackers:
    """`n` unauthenticated connections trickling a request's headers, reconnecting when dropped."""

    def __init__(self, port: int, n: int) -> None:
        self.port = port
        self.n = n
        self.stop = threading.Event()
        self.opened = 0
        self.dropped = 0
        self.answers: list[bytes] = []  # what the gateway said to any of them (a 503 would be here)
        self.all_open = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-attackers", daemon=True)

    def __enter__(self) -> SlowAttackers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(10)

    def _connect(self) -> socket.socket | None:
        if self.opened >= MAX_RECONNECTS:
            return None
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # a key would come later; never does
        except OSError:
            return None
        s.setblocking(False)
        self.opened += 1
        return s

    def _run(self) -> None:
        socks: dict[socket.socket, float] = {}  # open socket -> when it next trickles a byte
        waiting: list[float] = []  # when each dropped slot may connect again
        t_end = time.monotonic() + ATTACK_FOR_S
        for _ in range(self.n):
            s = self._connect()
            if s is not None:
                socks[s] = time.monotonic() + 1.0
        self.all_open.set()
        try:
            while not self.stop.is_set() and time.monotonic() < t_end:
                now = time.monotonic()
                while waiting and waiting[0] <= now:
                    waiting.pop(0)
                    s = self._connect()
                    if s is not None:
                        socks[s] = now + 1.0
                readable, _, _ = select.select(list(socks), [], [], 0.05)
                for s in readable:
                    try:
                        data = s.recv(4096)
                    except (ConnectionResetError, BlockingIOError):
                        data = b""
                    if data:
                        self.answers.append(data[:80])
                    del socks[s]
                    s.close()
                    self.dropped += 1
                    waiting.append(time.monotonic() + RECONNECT_PAUSE_S)
                for s, due in list(socks.items()):
                    if due <= now:
                        try:
                            s.send(b"x")  # one header byte: slow, never finishing
                            socks[s] = now + 1.0
                        except OSError:
                            del socks[s]
                            s.close()
                            self.dropped += 1
                            waiting.append(time.monotonic() + RECONNECT_PAUSE_S)
        finally:
            for s in socks:
                s.close()


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as emu:
        yield emu


def test_a_keyed_client_is_served_while_200_unauthenticated_slow_connections_press_on_100_slots(
    engine: EmulatorThread, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("load")
    with GatewayProcess(CONFIG.replace("{url}", engine.url), work) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0, timeout=30)
        statuses: list[int | None] = []
        retried = 0
        t0 = time.monotonic()
        with SlowAttackers(gw.port, ATTACKERS) as attack:
            assert attack.all_open.wait(30), "the attackers could not open their connections"
            time.sleep(1.0)  # every attacker is in: held, or already dropped for a newer one
            request = request_bytes(
                "POST",
                "/v1/chat/completions",
                {"authorization": f"Bearer {TEST_KEY}", "content-type": "application/json"},
                orjson.dumps(CHAT),
            )
            for _ in range(KEYED_CALLS):
                # a new connection per request: each one has to find room among the attackers. Until its
                # request is read it is as anonymous as theirs, and on a starved loop (a busy machine) a burst
                # of reconnecting attackers can shed it before then: it is dropped unanswered, and retried
                # once, as the SDKs retry a connection error. An answer other than 200 is never retried.
                fresh = exchange(gw.port, request, timeout=30)
                if fresh is None:
                    retried += 1
                    fresh = exchange(gw.port, request, timeout=30)
                statuses.append(None if fresh is None else fresh.status)
                reply = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                assert reply.choices[0].message is not None
            health = http_status(gw.url + "/healthz", timeout=10)
            took = time.monotonic() - t0
        client.close()
    assert statuses == [200] * KEYED_CALLS, statuses
    assert retried <= KEYED_CALLS // 4, f"{retried} of {KEYED_CALLS} new keyed connections were shed before read"
    assert health == 200
    # the attackers did press: more than the slots, and the gateway dropped the oldest for newer ones
    assert attack.opened >= ATTACKERS and attack.dropped >= ATTACKERS - MAX_CONNECTIONS, (attack.opened, attack.dropped)
    assert not [a for a in attack.answers if b" 503 " in a], attack.answers[:3]  # dropped, never refused
    assert took < ATTACK_FOR_S
