"""The bench's agent-sized request (bench/agent_request.py) and the targets and scenarios that send it: sizes
and shapes as a coding agent sends them, valid for each API by the gateway's own request parsers, the same
conversation in all three; the `gateway` (team) and `gateway-minimal` targets' configs; the agent table.
No gateway process, no load."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import agent_report  # noqa: E402
import agent_request as ar  # noqa: E402
import report  # noqa: E402
import run_context as rc  # noqa: E402
import stream_client  # noqa: E402
import targets  # noqa: E402

from llm_gateway.dialects.anthropic.request import to_chat  # noqa: E402
from llm_gateway.dialects.responses.request import parse as parse_responses  # noqa: E402
from llm_gateway.routing.request_info import read_request  # noqa: E402
from llm_gateway.settings.loader import load_config  # noqa: E402


@pytest.fixture(scope="module")
def bodies() -> dict[str, dict[str, Any]]:
    return ar.bodies()


def test_the_agent_request_is_74_kb_with_20_tools_and_46_messages(bodies: dict[str, dict[str, Any]]) -> None:
    chat = bodies["chat"]
    for d in ar.DIALECTS:
        assert 70_000 <= len(ar.encode(bodies[d])) <= 78_000, d
        assert len(bodies[d]["tools"]) == 20
    assert len(chat["messages"]) == 46
    assert chat["messages"][0]["role"] == "system" and len(chat["messages"][0]["content"]) > 8_000
    calls = [c for m in chat["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    results = [m for m in chat["messages"] if m["role"] == "tool"]
    assert len(calls) == len(results) >= 20
    assert [c["id"] for c in calls] == [m["tool_call_id"] for m in results]
    assert any(len(m.get("tool_calls", [])) > 1 for m in chat["messages"])  # parallel calls in one turn
    assert chat["messages"][-1]["role"] == "user"


def test_nothing_in_the_conversation_looks_like_a_field_the_fake_engine_reads(bodies: dict[str, Any]) -> None:
    # the fake engine finds max_tokens and stream in the raw bytes: the text must not carry them
    raw = ar.encode(bodies["chat"])
    assert raw.count(b'"max_tokens"') == 1 and raw.count(b'"stream"') == 1 and b"fake_" not in raw


def test_the_generator_is_deterministic(tmp_path: Path) -> None:
    paths = ar.write(tmp_path / "a")
    again = ar.write(tmp_path / "b")
    for d in ar.DIALECTS:
        assert paths[d].read_bytes() == again[d].read_bytes()
        assert json.loads(paths[d].read_bytes())["model"] == "fake-model"
    assert ar.encode(ar.bodies(seed=1)["chat"]) != paths["chat"].read_bytes()


def _calls(messages: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    return [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for m in messages
        for c in m.get("tool_calls") or []
    ]


def _texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages if m.get("content")]


def test_the_gateway_reads_the_chat_body(bodies: dict[str, Any]) -> None:
    info = read_request("chat", json.loads(ar.encode(bodies["chat"])))
    assert info.model == "fake-model" and info.max_tokens == 64 and not info.stream
    assert "tools" in info.needs
    assert 15_000 < info.prompt_tokens < 25_000  # ~74 KB of JSON, ~4 characters a token


def test_messages_and_responses_carry_the_same_conversation_as_chat(bodies: dict[str, Any]) -> None:
    chat = bodies["chat"]["messages"]
    msgs = to_chat(json.loads(ar.encode(bodies["messages"]))).body
    resp = parse_responses(json.loads(ar.encode(bodies["responses"])))
    assert resp.store is False and not resp.stream
    resp_body = resp.chat_body([])
    for translated in (msgs["messages"], resp_body["messages"]):
        assert len(translated) == len(chat) == 46
        assert [m["role"] for m in translated] == [m["role"] for m in chat]
        assert _texts(translated) == _texts(chat)
        assert _calls(translated) == _calls(chat)
        assert [m.get("tool_call_id") for m in translated] == [m.get("tool_call_id") for m in chat]
    for translated in (msgs, resp_body):
        assert [t["function"] for t in translated["tools"]] == [t["function"] for t in bodies["chat"]["tools"]]
    assert msgs["max_tokens"] == 64 and resp_body["max_tokens"] == 64


def test_the_stream_client_streams_a_native_body_with_its_dialects_token_field(tmp_path: Path) -> None:
    paths = ar.write(tmp_path)
    for d, field in (("chat", "max_tokens"), ("messages", "max_tokens"), ("responses", "max_output_tokens")):
        a = Namespace(body=str(paths[d]), model=None, dialect=d, tokens=64, engine_hold=None, tpot_ms=None)
        a.native_body = True
        body = json.loads(stream_client.request_body(a))
        assert body["stream"] is True and body[field] == 64
        assert {k: v for k, v in body.items() if k not in ("stream", field)} == {
            k: v for k, v in json.loads(paths[d].read_bytes()).items() if k not in ("stream", field)
        }


def test_agent_scenarios_join_the_default_set_whole_and_streamed_in_each_api() -> None:
    agent = [s for s in rc.DEFAULT_SCENARIOS if s in rc.AGENT]
    assert {rc.AGENT[s] for s in agent} == set(ar.DIALECTS)
    assert {rc.LOAD[s][0] for s in agent} == {"wrk", "stream"}
    for s in agent:
        assert s in rc.ORDER and rc.DIALECT[s] == rc.AGENT[s]
        assert (s in rc.GATEWAY_ONLY) == (rc.AGENT[s] != "chat")


def test_the_gateway_target_runs_as_a_team_and_gateway_minimal_the_minimal_config(tmp_path: Path) -> None:
    assert rc.GATEWAYS == {"gateway": "team", "gateway-minimal": "minimal"}
    assert {"gateway", "gateway-minimal", "smg", "aiohttp"} <= set(rc.TARGETS)
    assert targets.target_command("gateway") == targets.target_command("gateway-minimal")
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    team = load_config(targets.write_gateway_config(tmp_path / "t.yaml", urls, "k", profile="team"))
    minimal = load_config(targets.write_gateway_config(tmp_path / "m.yaml", urls, "k", profile="minimal"))
    key = team.auth.keys[0]
    assert key.budget is not None and key.limits.rpm == 10_000_000
    assert team.usage.ledger and team.server.data_dir == str(tmp_path / "data")
    assert team.routing.fair_queuing and all(b.max_concurrency == 32 for b in team.backends)
    assert team.admin.keys and team.models[0].price is not None
    assert not minimal.usage.ledger and minimal.auth.keys[0].budget is None and not minimal.admin.keys
    assert all(b.max_concurrency is None for b in minimal.backends)
    for cfg in (team, minimal):  # the agent-sized request has tools: a deployment without them answers 400
        assert all("tools" in d.capabilities for d in cfg.models[0].deployments)


def _agent_run(values: dict[str, dict[str, float]]) -> dict[str, Any]:
    targets_ = ["gateway", "gateway-minimal", "smg", "aiohttp", "direct"]
    result = {"p50": 0.5, "p99": 1.0, "rps": 100.0, "errors": 0}
    return {
        "config": {"targets": targets_, "scenarios": list(agent_report.SCENARIOS), "duration": 1},
        "results": {
            t: {"scenarios": {s: {**result, "cpu_us_per_req": v} for s, v in per.items()}} for t, per in values.items()
        },
    }


def test_the_agent_table_checks_issue_36s_goals() -> None:
    data = _agent_run(
        {
            "gateway": {"ag_c64": 400.0, "agmsg_c64": 480.0, "agresp_c64": 600.0},
            "gateway-minimal": {"ag_c64": 300.0, "agmsg_c64": 330.0, "agresp_c64": 360.0},
            "smg": {"ag_c64": 500.0},
            "aiohttp": {"ag_c64": 180.0},
        }
    )
    text = "\n".join(agent_report.render(data))
    assert "| gateway: chat CPU / smg's (c64) | ≤ 1x | 0.80x | met |" in text
    assert "| gateway: chat CPU / aiohttp's (c64) | ≤ 2x | 2.22x | **not met** |" in text
    assert "| gateway: messages CPU / chat's (c64) | ≤ 1.3x | 1.20x | met |" in text
    assert "| gateway: responses CPU / chat's (c64) | ≤ 1.3x | 1.50x | **not met** |" in text
    assert "| gateway-minimal: chat CPU / aiohttp's (c64) | ≤ 2x | 1.67x | met |" in text
    assert "| ag_c64 | chat, c64: CPU µs / request | 400 | 300 | 500 | 180 | - |" in text
    assert "**Agent-sized requests**" in report.render(data)
    assert agent_report.render({"config": {"scenarios": ["ns_c1"]}}) == []
