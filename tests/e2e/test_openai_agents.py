"""The OpenAI Agents SDK runs one agent turn with a function tool through the gateway's Responses API,
against the real vLLM with the tiny model.

The tiny model's text is noise, so the protocol is what is checked: with the tool named as the tool
choice vLLM constrains its output to the tool's parameters (its structured-output backend; the city is
an enum so that the JSON ends within a few tokens), the SDK reads the
streamed and whole `function_call` items, runs the tool with the arguments the model produced, sends the
output back as a `function_call_output` item (the SDK's default resets `tool_choice` to auto after a tool
call), and the second answer ends the run with a final output. That answer is the agent's typed
`output_type` (`text.format` json_schema, also constrained by vLLM): the tiny model never ends free
text on its own, and the SDK takes a response that stopped at `max_output_tokens` (`incomplete`) as a
failed turn. Both the whole (`Runner.run`) and the
streamed (`Runner.run_streamed`) paths are run, and chaining by `previous_response_id` once (the SDK's
`previous_response_id` mode: only the new items go, the gateway puts the stored conversation first)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from pydantic import BaseModel

from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

CONFIG = """
server: {{access_log: false, data_dir: "{data}"}}
auth: {{mode: none}}
backends:
  - {{name: vllm, engine: vllm, url: "{url}", api_key: "{key}", probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments: [{{backend: vllm, model: "{model}", format: safetensors, capabilities: [chat, tools, json_schema]}}]
"""


@pytest.fixture(scope="module")
def gateway(vllm_server: RealEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("gw-agents")
    cfg = CONFIG.format(url=vllm_server.url, key=vllm_server.api_key, model=vllm_server.model, data=work / "data")
    with GatewayProcess(cfg, work) as gw:
        yield gw


class Weather(BaseModel):
    """The agent's answer: one boolean, so that the constrained JSON ends within a few tokens."""

    sunny: bool


@pytest.fixture
async def client(gateway: GatewayProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK's client, closed with the test's event loop still running: one left to the garbage collector
    closes its connections after that loop has closed ("Event loop is closed", printed under a later test)."""
    sdk = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield sdk
    await sdk.close()


def agent_for(client: openai.AsyncOpenAI, calls: list[str]) -> Agent[Any]:
    set_tracing_disabled(True)  # no traces to OpenAI's servers: this machine cannot reach them anyway

    @function_tool
    def get_weather(city: Literal["Paris", "Rome", "Oslo"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return "18C and sunny"

    return Agent(
        name="weather",
        instructions="Answer with the weather. Use the tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="tiny", openai_client=client),
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=48, temperature=0.0),
        output_type=Weather,
    )


def check_turn(result: Any, calls: list[str]) -> None:
    assert len(calls) == 1 and isinstance(calls[0], str)  # the tool ran once, with the model's argument
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert kinds[-1] == "message_output_item", kinds
    assert isinstance(result.final_output, Weather)
    assert len(result.raw_responses) == 2  # one model call for the tool, one for the answer
    for r in result.raw_responses:
        assert r.response_id and r.response_id.startswith("resp_")
        assert r.usage.output_tokens > 0 and r.usage.input_tokens > 0
    # the second call's prompt held the tool call and its output: the engine counted more input
    assert result.raw_responses[1].usage.input_tokens > result.raw_responses[0].usage.input_tokens


async def test_one_agent_turn_with_a_function_tool(client: openai.AsyncOpenAI) -> None:
    calls: list[str] = []
    result = await Runner.run(agent_for(client, calls), "What is the weather in Paris?", max_turns=3)
    check_turn(result, calls)


async def test_one_streamed_agent_turn_with_a_function_tool(client: openai.AsyncOpenAI) -> None:
    calls: list[str] = []
    run = Runner.run_streamed(agent_for(client, calls), "What is the weather in Rome?", max_turns=3)
    kinds = [ev.type async for ev in run.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    check_turn(run, calls)


async def test_an_agent_turn_chained_by_previous_response_id(client: openai.AsyncOpenAI) -> None:
    calls: list[str] = []
    agent = agent_for(client, calls)
    first = await Runner.run(agent, "Weather in Oslo?", max_turns=3, auto_previous_response_id=True)
    check_turn(first, calls)
    calls.clear()
    second = await Runner.run(
        agent.clone(model_settings=ModelSettings(tool_choice="none", max_tokens=48, temperature=0.0)),
        "And tomorrow?",
        previous_response_id=first.last_response_id,
    )
    assert calls == [] and isinstance(second.final_output, Weather)
    assert second.raw_responses[0].usage.input_tokens > first.raw_responses[-1].usage.input_tokens
