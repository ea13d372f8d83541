"""Bad input from clients, property-based: at least 1,000 generated requests across every public
endpoint (malformed JSON, wrong types, huge strings, deep nesting, invalid UTF-8, bogus
Content-Length, unknown content types, odd auth headers), sent as raw bytes to a gateway process.

Each must be answered with a 4xx in the OpenAI envelope (or a 2xx when it happens to be valid),
never a 5xx of the gateway's own, never a crash; the gateway is healthy afterwards.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_gateway.access.keys import digest_of
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.raw_http import exchange, request_bytes

KEY = "sk-fuzz-key-0123456789"
STATS: Counter[str] = Counter()

json_scalar = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30)
)
json_value = st.recursive(
    json_scalar, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool", 7, None]),
        "content": json_value | st.text(max_size=50),
    },
)
chat_like = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["m", "nope", "", "m@gguf", "m@exl3"]) | json_value,
        "messages": st.lists(message, max_size=3) | json_value,
        "prompt": st.text(max_size=20) | json_value,
        "input": st.text(max_size=20) | json_value,
        "stream": st.booleans() | json_value,
        "stream_options": json_value,
        "max_tokens": st.integers(-5, 3) | json_value,
        "max_completion_tokens": json_value,
        "temperature": json_value,
        "tools": json_value,
        "response_format": json_value,
        "n": json_value,
    },
)


def _dumps(v: object) -> bytes:
    return json.dumps(v).encode()  # stdlib: also writes >64-bit integers and Infinity, which a gateway must refuse


def _nested(depth: int) -> bytes:
    return b'{"model":"m","messages":' + b"[" * depth + b"]" * depth + b"}"


raw_body = st.one_of(
    chat_like.map(_dumps),
    json_value.map(_dumps),
    st.binary(max_size=200),
    st.integers(1, 200_000).map(_nested),
    st.binary(min_size=1, max_size=8).map(
        lambda b: b'{"model":"m","messages":[{"role":"user","content":"' + b + b'"}]}'
    ),
    st.sampled_from([b"\xff\xfe\xfd", b'{"model": "\xc3\x28"}', b"{", b'{"model":', b"null", b"[]", b'""']),
    st.integers(1, 3).map(
        lambda n: b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (n * 700_000) + b'"}]}'
    ),
    chat_like.map(lambda d: _dumps(d)[: max(1, len(_dumps(d)) // 2)]),
)
content_type = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "",
        "\x01garbage",
        None,
    ]
)
content_length = st.sampled_from(["auto", "auto", "auto", None, "-1", "abc", "0", "1", "99999999999999999999"])
auth = st.sampled_from([f"Bearer {KEY}", f"Bearer {KEY}", "Bearer wrong", "Basic abc", "", "Bearer", None])
target = st.sampled_from(
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/embeddings"),
        ("POST", "/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/m"),
        ("GET", "/v1/models/%00%ff"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/openapi.json"),
        ("PUT", "/v1/chat/completions"),
        ("DELETE", "/v1/models"),
        ("POST", "/v1/nothing"),
        ("GET", "/" + "a" * 5000),
    ]
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", embeddings=True)) as emu:
        cfg = f"""
server: {{access_log: false, max_body_bytes: 1048576, body_timeout_s: 2}}
auth:
  mode: keys
  keys: [{{name: fuzz, sha256: "{digest_of(KEY)}"}}]
backends:
  - {{name: emu, engine: vllm, url: "{emu.url}", probe: {{interval_s: 1}}}}
models:
  - name: m
    deployments: [{{backend: emu, model: tiny, format: safetensors, capabilities: [chat, completions, embeddings]}}]
"""
        with GatewayProcess(cfg, tmp_path_factory.mktemp("fuzz")) as gw:
            yield gw


@settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(target=target, body=raw_body, ct=content_type, cl=content_length, authorization=auth)
def test_every_generated_request_gets_a_clean_answer(gateway, target, body, ct, cl, authorization) -> None:
    method, path = target
    headers: list[tuple[str, str]] = []
    if ct is not None:
        headers.append(("content-type", ct))
    if authorization is not None:
        headers.append(("authorization", authorization))
    if method == "GET":
        body, cl = b"", "auto"
    resp = exchange(gateway.port, request_bytes(method, path, headers, body, content_length=cl), timeout=15)
    assert resp is not None, "the gateway closed the connection without answering"
    STATS[f"{resp.status // 100}xx"] += 1
    STATS[str(resp.status)] += 1
    assert resp.status < 500, (resp.status, resp.body[:300])
    if resp.status >= 400:
        err = orjson.loads(resp.body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_the_gateway_is_healthy_after_the_fuzzing(gateway: GatewayProcess) -> None:
    total = sum(v for k, v in STATS.items() if k.endswith("xx"))
    print(
        f"\nfuzz cases: {total}; by class: {dict((k, v) for k, v in sorted(STATS.items()) if k.endswith('xx'))}; "
        f"by status: {dict((k, v) for k, v in sorted(STATS.items()) if not k.endswith('xx'))}"
    )
    assert total >= 1000
    assert gateway.proc is not None and gateway.proc.poll() is None
    ok = exchange(gateway.port, request_bytes("GET", "/healthz", {}, b""))
    assert ok is not None and ok.status == 200
    chat = exchange(
        gateway.port,
        request_bytes(
            "POST",
            "/v1/chat/completions",
            {"content-type": "application/json", "authorization": f"Bearer {KEY}"},
            orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 3}),
        ),
    )
    assert chat is not None and chat.status == 200
    log = Path(gateway.log_path).read_text()
    assert "Traceback" not in log and "unexpected error" not in log
