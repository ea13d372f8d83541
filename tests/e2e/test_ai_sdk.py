"""The Vercel AI SDK (npm ``ai`` + ``@ai-sdk/openai``, the versions ``scripts/setup_dev.sh`` pins) through the
gateway's Responses API with ``store`` on, the provider's default: from the second turn it sends earlier
output items as ``{"type": "item_reference", "id"}``, which the gateway resolves from its store (issue 42).
The SDK runs in Node (tests/e2e/ai_sdk_client.mjs, importing the cached install), the gateway as a real
process.

- A three-turn conversation on a real engine: llama-server with the tiny model (tests/support/real_engines.py).
- A two-step tool loop with reasoning, streamed. The tiny models cannot call tools, so the engine there is a
  scripted one behind ``engine: openai``: a small aiohttp server in this module that answers chat
  completions from a script (step 1: ``reasoning_content`` and a ``get_weather`` tool call; step 2, once
  the conversation holds the tool's output: reasoning and text), whole or streamed as asked, and records
  the chat bodies the gateway sends it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from llm_gateway.access.keys import digest_of
from tests.conftest import require
from tests.support.agent_cli import AgentCliMissing, ai_sdk_node_modules
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

KEY = "sk-e2e-ai-sdk-0123456789"
CLIENT = Path(__file__).with_name("ai_sdk_client.mjs")
CONFIG = """
server: {{access_log: false, data_dir: "{data}"}}
auth:
  mode: keys
  keys:
    - {{name: app, sha256: "{key}"}}
backends:
  - {{name: llama, engine: llama-server, url: "{llama}", api_key: "{llama_key}", capacity: 1,
     probe: {{interval_s: 0.5}}}}
  - {{name: scripted, engine: openai, url: "{scripted}", probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments: [{{backend: llama, model: "{llama_model}", format: gguf}}]
  - name: scripted
    deployments: [{{backend: scripted, model: scripted-model, format: gguf, capabilities: [chat, tools]}}]
"""
THINK_1, THINK_2 = "The user wants the weather: call the tool.", "The tool answered; say it."
FINAL = "It is 18C and sunny in Paris."


class ScriptedEngine:
    """An OpenAI-compatible engine that answers from a script, in a thread of its own (see the module's
    docstring); `bodies` are the chat requests it got."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScriptedEngine:
        self._thread.start()
        assert self._ready.wait(10), "the scripted engine did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted-model", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        answered = any(m.get("role") == "tool" for m in body["messages"])
        if answered:
            deltas: list[dict[str, Any]] = [{"reasoning_content": THINK_2}, {"content": FINAL}]
            message: dict[str, Any] = {"role": "assistant", "content": FINAL, "reasoning_content": THINK_2}
            finish = "stop"
        else:
            call = {"id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
            args = '{"city":"Paris"}'
            deltas = [
                {"reasoning_content": THINK_1},
                {"tool_calls": [{"index": 0, **call}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": args}}]},
            ]
            whole = {**call, "function": {"name": "get_weather", "arguments": args}}
            message = {"role": "assistant", "content": None, "reasoning_content": THINK_1, "tool_calls": [whole]}
            finish = "tool_calls"
        usage = {"prompt_tokens": 20 * len(body["messages"]), "completion_tokens": 9, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + 9
        head = {"id": f"chatcmpl-{len(self.bodies)}", "created": 1, "model": "scripted-model"}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            return web.json_response({**head, "object": "chat.completion", "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {**head, "object": "chat.completion.chunk"}
        for i, delta in enumerate([{"role": "assistant", "content": ""}, *deltas, {}]):
            choice = {"index": 0, "delta": delta, "finish_reason": finish if i == len(deltas) + 1 else None}
            await resp.write(b"data: " + orjson.dumps({**chunk, "choices": [choice]}) + b"\n\n")
        await resp.write(b"data: " + orjson.dumps({**chunk, "choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture(scope="module")
def node_modules() -> Path:
    try:
        return ai_sdk_node_modules()
    except AgentCliMissing as e:
        require(str(e))
        raise


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedEngine]:
    with ScriptedEngine() as engine:
        yield engine


@pytest.fixture(scope="module")
def gateway(
    llama_server: RealEngine, scripted: ScriptedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("gw-ai-sdk")
    cfg = CONFIG.format(
        data=work / "data",
        key=digest_of(KEY),
        llama=llama_server.url,
        llama_key=llama_server.api_key,
        llama_model=llama_server.model,
        scripted=scripted.url,
    )
    with GatewayProcess(cfg, work) as gw:
        yield gw


def run_sdk(node_modules: Path, tmp_path: Path, gateway: GatewayProcess, model: str, scenario: str) -> dict[str, Any]:
    """Run the client script beside a link to the SDK's node_modules (Node resolves imports from the script's
    folder up); its JSON line, or the failure with what it printed."""
    (tmp_path / "node_modules").symlink_to(node_modules, target_is_directory=True)
    script = tmp_path / CLIENT.name
    script.write_bytes(CLIENT.read_bytes())
    cfg = {"baseURL": gateway.url + "/v1", "apiKey": KEY, "model": model, "scenario": scenario}
    res = subprocess.run(
        ["node", str(script), json.dumps(cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert res.returncode == 0, f"node exited {res.returncode}:\n{res.stderr[-4000:]}\n{gateway.log_text()[-3000:]}"
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def references(body: dict[str, Any]) -> list[str]:
    return [it["id"] for it in body["input"] if it.get("type") == "item_reference"]


def retriever(gateway: GatewayProcess) -> Any:
    """`responses.retrieve` of the openai SDK, as the key the AI SDK uses."""
    sdk = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    return sdk.responses.retrieve


def test_a_three_turn_conversation_on_the_real_engine(
    node_modules: Path, tmp_path: Path, gateway: GatewayProcess
) -> None:
    out = run_sdk(node_modules, tmp_path, gateway, "tiny", "conversation")
    turns, sent = out["result"], [s["body"] for s in out["sent"]]
    assert len(turns) == 3 and all(t["text"] for t in turns), turns
    assert [b.get("store", True) for b in sent] == [True, True, True]  # the provider's default
    assert references(sent[0]) == []
    # from the second turn the SDK names its earlier answers by id: the gateway's own output items
    said = [r.output[0].id for r in map(retriever(gateway), (t["id"] for t in turns))]
    assert references(sent[1]) == said[:1] and references(sent[2]) == said[:2]
    # the engine got the whole conversation: the prompt grew with each answer put back in it
    assert turns[0]["inputTokens"] < turns[1]["inputTokens"] < turns[2]["inputTokens"]
    third = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0).responses.input_items.list(
        turns[2]["id"], order="asc"
    )
    listed = [(it.type, getattr(it, "role", None)) for it in third.data]
    assert listed == [("message", r) for r in ("user", "assistant", "user", "assistant", "user")]
    assert [it.id for it in third.data if getattr(it, "role", None) == "assistant"] == said[:2]


def test_a_two_step_tool_loop_with_reasoning(
    node_modules: Path, tmp_path: Path, gateway: GatewayProcess, scripted: ScriptedEngine
) -> None:
    scripted.bodies.clear()
    out = run_sdk(node_modules, tmp_path, gateway, "scripted", "tools")
    result, sent = out["result"], [s["body"] for s in out["sent"]]
    assert result["failure"] is None, result["failure"]
    assert result["calls"] == ["Paris"] and result["text"] == FINAL
    assert [s["finishReason"] for s in result["steps"]] == ["tool-calls", "stop"]
    assert result["steps"][0]["toolCalls"] == ["get_weather"]
    assert len(sent) == 2 and all(b.get("stream") for b in sent)
    (ref,) = references(sent[1])  # step 2 names the reasoning of step 1 by its id
    assert ref.startswith("rs_")
    # ... which the gateway resolved: the engine got the reasoning back with the tool call it went with
    assert len(scripted.bodies) == 2
    assert scripted.bodies[1]["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": THINK_1,
            "tool_calls": [
                {
                    "id": "call_w1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_w1", "content": "18C and sunny in Paris"},
    ]
