"""Smoke tests of the bench harness (bench/): the fake engine speaks what the gateway and the load
generators expect, the generated gateway config is valid with every feature on, and the reports render.
Fast (a few seconds): no gateway process, no load."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import profile_report  # noqa: E402
import report  # noqa: E402
import stream_client  # noqa: E402
import streams  # noqa: E402
import targets  # noqa: E402

from llm_gateway.dialects.anthropic.stream import StreamTranslator  # noqa: E402
from llm_gateway.dialects.responses.request import parse as parse_responses  # noqa: E402
from llm_gateway.dialects.responses.stream import ResponsesStream  # noqa: E402
from llm_gateway.settings.loader import load_config  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    port = _free_port()
    p = subprocess.Popen(
        [sys.executable, str(BENCH / "fake_engine.py"), "--port", str(port), "--tokens", "5", "--tpot-ms", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                _get(base + "/health")
                break
            except OSError:
                time.sleep(0.05)
        yield base
    finally:
        p.terminate()
        p.wait(10)


def test_fake_engine_answers_a_chat_completion_with_usage(engine: str) -> None:
    status, raw = _post(engine + "/v1/chat/completions", {"model": "fake-model", "max_tokens": 7, "messages": []})
    body = json.loads(raw)
    assert status == 200
    assert body["usage"]["completion_tokens"] == 7
    assert len(body["choices"][0]["message"]["content"].split()) == 7


def test_fake_engine_answers_an_unknown_route_as_vllm_does_so_messages_are_translated(engine: str) -> None:
    # vLLM serves /v1/messages and the gateway passes it through natively; a 404 in vLLM's shape for a
    # route it lacks is what makes the gateway translate instead (msg64_c16 measures the translation)
    from llm_gateway.adapters.vllm import VLLMAdapter
    from llm_gateway.types import BackendInfo

    with pytest.raises(urllib.error.HTTPError) as e:
        _post(engine + "/v1/messages", {"model": "fake-model", "max_tokens": 4, "messages": []})
    assert e.value.code == 404
    assert VLLMAdapter(BackendInfo("b", engine)).native_unserved("messages", 404, e.value.read())


def test_fake_engine_streams_role_tokens_finish_usage_done(engine: str) -> None:
    status, raw = _post(
        engine + "/v1/chat/completions",
        {"model": "fake-model", "stream": True, "max_tokens": 4, "stream_options": {"include_usage": True}},
    )
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    assert status == 200
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(1 for e in events if e["choices"] and e["choices"][0]["delta"].get("content")) == 4
    assert events[-1]["usage"]["completion_tokens"] == 4 and events[-1]["choices"] == []


def test_fake_engine_sends_usage_only_when_asked(engine: str) -> None:
    _, raw = _post(engine + "/v1/chat/completions", {"model": "fake-model", "stream": True, "max_tokens": 2})
    assert b'"usage"' not in raw and raw.rstrip().endswith(b"data: [DONE]")


def test_held_stream_lasts_until_released(engine: str) -> None:
    body = {"model": "fake-model", "stream": True, "fake_hold": "t1", "fake_tpot_ms": 20}
    release = subprocess.Popen(
        [sys.executable, "-c", f"import time,urllib.request;time.sleep(0.3);"
         f"urllib.request.urlopen(urllib.request.Request('{engine}/fake/release?hold=t1', b''))"]
    )  # fmt: skip
    t0 = time.monotonic()
    _, raw = _post(engine + "/v1/chat/completions", body)
    release.wait(10)
    assert time.monotonic() - t0 >= 0.25
    assert raw.count(b'"content":" quick"') >= 5  # a token every 20 ms while held
    assert raw.rstrip().endswith(b"data: [DONE]")


def test_fake_engine_reports_vllm_load_metrics_models_and_health(engine: str) -> None:
    _, metrics = _get(engine + "/metrics")
    for name in (b"vllm:num_requests_running", b"vllm:num_requests_waiting", b"vllm:kv_cache_usage_perc"):
        assert name in metrics
    _, models = _get(engine + "/v1/models")
    assert json.loads(models)["data"][0]["id"] == "fake-model"
    assert _get(engine + "/health")[0] == 200


def test_generated_gateway_config_turns_every_feature_on(tmp_path: Path) -> None:
    path = targets.write_gateway_config(tmp_path / "gw.yaml", ["http://127.0.0.1:1", "http://127.0.0.1:2"], "k")
    cfg = load_config(path)
    assert cfg.auth.mode == "keys" and cfg.auth.keys[0].limits.rpm == 10_000_000
    assert cfg.limits.store == "memory" and cfg.server.access_log is False
    assert {b.engine for b in cfg.backends} == {"vllm"} and cfg.models[0].strategy == "least_load"


def test_report_marks_targets_met_and_not_met() -> None:
    scn = {"ns_c1": {"p50": 1.0, "p99": 2.0, "errors": 0}, "rss_idle": {"rss_mb": 50.0}}
    data = {
        "config": {"targets": ["gateway", "direct"], "scenarios": ["ns_c1", "rss_idle"], "duration": 1},
        "results": {"gateway": {"scenarios": scn}, "direct": {"scenarios": {"ns_c1": {"p50": 0.1, "p99": 0.2}}}},
    }
    text = report.render(data)
    assert "| ns_c1 added latency p50, ms | ≤ 0.5 | 0.90 | **not met** |" in text
    assert "| rss_idle RSS, MB | ≤ 80 | 50.0 | met |" in text


def test_profile_report_splits_own_code_from_libraries() -> None:
    text = profile_report.from_collapsed(
        "run (uvloop/__init__.py:1);Runner.run (asyncio/runners.py:118) 5\n"
        "run (uvloop/__init__.py:1);handle (llm_gateway/service/pipeline.py:10) 3\n"
        "run (uvloop/__init__.py:1);send (aiohttp/client.py:5) 2\n"
    )
    assert " 30.0%  gateway + adapters (own code)" in text
    assert " 50.0%  uvloop C event loop" in text
    assert " 20.0%  aiohttp" in text


# ---------- the stream client's per-dialect reading (what the msg64/resp64 scenarios count) ----------
def _read(dialect: str, raw: bytes, piece: int = 7) -> stream_client.SSEReader:
    """Feed `raw` in small pieces (frames split across reads, as on the wire) and finish."""
    sse = stream_client.SSEReader(dialect)
    for i in range(0, len(raw), piece):
        sse.feed(raw[i : i + piece])
    sse.finish()
    return sse


def _engine_stream(engine: str, tokens: int) -> bytes:
    body = {"model": "fake-model", "stream": True, "max_tokens": tokens, "stream_options": {"include_usage": True}}
    return _post(engine + "/v1/chat/completions", body)[1]


def test_chat_stream_counts_token_deltas_not_role_finish_or_usage_frames(engine: str) -> None:
    sse = _read("chat", _engine_stream(engine, 5))
    assert (sse.error, sse.ended, sse.deltas, sse.frames) == (None, True, 5, 9)  # role+5+finish+usage+[DONE]


def test_messages_stream_of_the_gateways_translation_counts_text_deltas(engine: str) -> None:
    t = StreamTranslator((), 10)
    raw = t.feed(_engine_stream(engine, 5)) + t.finish()
    sse = _read("messages", raw)
    assert (sse.error, sse.ended, sse.deltas) == (None, True, 5)
    assert sse.frames == 5 + 6  # message_start, ping, block start/stop, message_delta, message_stop


def test_responses_stream_of_the_gateways_translation_counts_output_text_deltas(engine: str) -> None:
    chat = json.loads((BENCH / "request.json").read_bytes())
    t = ResponsesStream(parse_responses(stream_client.dialect_body(chat, "responses", 5)), "resp_bench")
    raw = t.feed(_engine_stream(engine, 5)) + t.finish()
    sse = _read("responses", raw)
    assert (sse.error, sse.ended, sse.deltas) == (None, True, 5)
    assert sse.frames == 5 + 8  # created, in_progress, item/part added, text/part/item done, the final event


def _responses_stream(n: int, end: str = "response.completed") -> bytes:
    def ev(name: str, **data: object) -> bytes:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

    resp = {"id": "resp_1", "status": "in_progress", "error": None, "incomplete_details": None}
    out = ev("response.created", response=resp) + ev("response.in_progress", response=resp)
    out += ev("response.output_item.added", output_index=0, item={"type": "message"})
    out += ev("response.content_part.added", output_index=0, content_index=0, part={"type": "output_text"})
    out += b"".join(ev("response.output_text.delta", output_index=0, delta=f" t{i}") for i in range(n))
    out += ev("response.output_text.done", text="...") + ev("response.content_part.done", part={})
    out += ev("response.output_item.done", item={})
    if end == "response.incomplete":
        return out + ev(
            end, response={**resp, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
        )
    return out + ev(end, response={**resp, "status": "completed"})


def test_responses_stream_counts_output_text_deltas_and_needs_its_terminal_event() -> None:
    sse = _read("responses", _responses_stream(4))
    assert (sse.error, sse.ended, sse.deltas, sse.frames) == (None, True, 4, 12)
    assert _read("responses", _responses_stream(4, "response.incomplete")).error is None  # cut at max_output_tokens
    assert _read("responses", _responses_stream(4, "response.failed")).error == "error_event"


@pytest.mark.parametrize(
    ("dialect", "raw", "error"),
    [
        ("chat", b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', "no_terminal_frame"),
        ("chat", b'data: {"error":{"message":"x"}}\n\ndata: [DONE]\n\n', "error_event"),
        ("chat", b"data: [DONE]\n\ndata: [DONE]\n\n", "frame_after_end"),
        ("chat", b"data: {not json\n\ndata: [DONE]\n\n", "bad_json"),
        (
            "messages",
            b'event: message_stop\ndata: {"type":"message_stop"}\n\nevent: ping\ndata: {"type":"ping"}\n\n',
            "frame_after_end",
        ),
        ("messages", b'event: message_stop\ndata: {"type":"message_stop"}\n\nevent: pi', "partial_frame"),
        ("messages", b'event: error\ndata: {"type":"error","error":{"type":"api_error"}}\n\n', "error_event"),
        ("messages", b'event: ping\ndata: {"type":"message_stop"}\n\n', "type_mismatch"),
        ("responses", _responses_stream(3)[:-40], "partial_frame"),
    ],
)
def test_a_broken_stream_is_never_good(dialect: str, raw: bytes, error: str) -> None:
    assert _read(dialect, raw).error == error


def test_every_dialect_asks_for_the_same_prompt_and_token_count() -> None:
    chat = json.loads((BENCH / "request.json").read_bytes())
    msg = stream_client.dialect_body(chat, "messages", 64)
    resp = stream_client.dialect_body(chat, "responses", 64)
    system, user = chat["messages"][0]["content"], chat["messages"][1]["content"]
    assert msg["max_tokens"] == resp["max_output_tokens"] == 64 and msg["stream"] is resp["stream"] is True
    assert msg["system"] == resp["instructions"] == system
    assert msg["messages"] == [{"role": "user", "content": user}] and resp["input"] == user
    assert resp["store"] is False and msg["temperature"] == resp["temperature"] == chat["temperature"]


def _dialect_run(msg: dict, resp: dict) -> dict:
    chat = {"cpu_us_per_event": 30.0, "errors": 0, "deltas_per_stream": 64}
    return {
        "config": {
            "targets": ["gateway", "direct"],
            "scenarios": ["st64_c16", "msg64_c16", "resp64_c16"],
            "duration": 1,
        },
        "results": {
            "gateway": {"scenarios": {"st64_c16": chat, "msg64_c16": msg, "resp64_c16": resp}},
            "direct": {"scenarios": {"msg64_c16": {"skipped": "gateway only"}}},
        },
    }


def test_report_puts_the_dialect_ratios_to_chat_first() -> None:
    text = report.render(_dialect_run({"cpu_us_per_event": 36.0, "errors": 0}, {"cpu_us_per_event": 60.0, "errors": 0}))
    assert text.startswith("**Streamed dialects**")
    assert "| messages / chat completions, CPU per relayed event | ≤ 1.5x | 1.20x | met |" in text
    assert "| responses / chat completions, CPU per relayed event | ≤ 1.5x | 2.00x | **not met** |" in text
    assert "skipped for direct" in text


def test_report_gives_no_ratio_for_broken_or_missing_dialect_streams() -> None:
    broken = {"cpu_us_per_event": 10.0, "errors": 3, "error_kinds": {"no_terminal_frame": 3}}
    text = report.render(_dialect_run(broken, {"unavailable": "POST /v1/responses answered 404: not found"}))
    assert "| ≤ 1.5x | invalid: 3 broken streams {'no_terminal_frame': 3} | - |" in text
    assert "| ≤ 1.5x | unavailable: POST /v1/responses answered 404: not found | - |" in text


def _stream_client(url: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, str(BENCH / "stream_client.py"), url, "-c", "2", "--max-requests", "4", *args],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.decode()
    line = next(x for x in out.splitlines() if x.startswith("STREAMJSON "))
    return dict(json.loads(line[len("STREAMJSON ") :]))


def test_stream_client_measures_each_streams_longest_gap_and_counts_stalls(engine: str) -> None:
    # streams.py's no-stall verdict (10,000 paced streams) rests on these fields: 4 streams of 12 tokens 50 ms
    # apart have gaps of about 50 ms (each stream lasts about 600 ms: a gap measured from the first byte instead
    # of the read before would pass 400 ms), so every one is stalled past 5 ms and none past 400 ms
    url = engine + "/v1/chat/completions"
    tight = _stream_client(url, "--tokens", "12", "--tpot-ms", "50", "--stall-ms", "5")
    assert tight["requests"] == 4 and tight["errors"] == 0
    assert tight["stalled"] == 4
    loose = _stream_client(url, "--tokens", "12", "--tpot-ms", "50", "--stall-ms", "400")
    assert loose["requests"] == 4 and loose["stalled"] == 0
    assert 40_000 <= loose["max_gap_us"] < 400_000
    assert _stream_client(url, "--tokens", "2")["stalled"] is None  # no --stall-ms: no stall rule, not "0 stalled"


def test_streams_verdict_fails_a_round_with_a_stalled_stream() -> None:
    def rnd(stalled: int) -> dict:
        kinds = {"total": 20, "not_sockets": 10, "client": 0, "upstream": 0}
        snap = {"fds": 20, "rss_mb": 90.0, "fd_kinds": kinds}
        return {"n": 10, "ok": 10, "errors": 0, "all_open_s": 1.0, "open_at_once": 10, "stalled": stalled,
                "before": snap, "after": snap}  # fmt: skip

    plan = {"backends": 2, "tpot_ms": 200}
    assert streams.verdict([rnd(0), rnd(0)], plan)["ok"]
    v = streams.verdict([rnd(0), rnd(1)], plan)
    assert not v["ok"] and not v["no_stall"] and v["all_completed"] and v["no_leak"]


def test_each_round_of_streams_connects_from_addresses_the_round_before_did_not_use() -> None:
    # the last round's client ports sit in TIME_WAIT: binding among them cost later rounds ~1 s of TTFT
    for procs in (1, 3):
        rounds = [{streams.client_address(r, i, procs) for i in range(procs)} for r in (1, 2, 3)]
        assert all(len(addrs) == procs for addrs in rounds)
        assert not rounds[0] & rounds[1] and not rounds[1] & rounds[2]
        assert all(a.startswith("127.0.0.") and 2 <= int(a.rsplit(".", 1)[1]) <= 254 for r in rounds for a in r)
