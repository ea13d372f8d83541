"""The dialects on every contract target: the unmodified `openai` SDK over `/v1/responses` and the unmodified
`anthropic` SDK over `/v1/messages`, each through a gateway process in front of real llama-server, vLLM and
Ollama and the emulators of all six engines (the targets of tests/contract/test_contract.py).

OpenAI: `responses.create` whole and streamed (`responses.stream`, and `create(stream=True)`), a function
tool offered, a `function_call` with its `function_call_output` in the input, and `previous_response_id`
chaining with the stored response read back (`GET /v1/responses/{id}`). Anthropic: `messages.create` and
`messages.stream()`, tools offered, a tool_use / tool_result round trip in the history, and
`messages.count_tokens`, counted by the engine where its adapter can (`x-gateway-token-count: engine`),
else the gateway's estimate. The tiny models never call a tool: that tools are accepted, reach the engine
(the prompt grows) and are answered is what is shown here; the SDKs' reading of tool calls is in
tests/e2e/test_openai_responses.py and tests/e2e/test_anthropic_sdk.py.

A reply stops at the token limit (the tiny models never stop on their own, and 8 tokens keep the real
engines fast): a Response is then `incomplete` with reason `max_output_tokens` (its stream ends with
`response.incomplete`, which the SDK's `get_final_response()` does not take, so the terminal event is read
here), a Message has stop_reason `max_tokens`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.contract.targets import Target, open_target
from tests.contract.test_contract import TARGETS
from tests.support.gateway_process import GatewayProcess

CONFIG = """
server: {{access_log: false, data_dir: "{data}"}}
auth: {{mode: none}}
routing: {{retries: 0}}
backends:
  - {{name: good, engine: {engine}, url: "{url}", api_key: "{key}", capacity: 4, probe: {{interval_s: 0.5}}}}
models:
  - name: m
    deployments: [{{backend: good, model: "{model}", format: {fmt}, capabilities: [chat, tools, json_schema]}}]
"""
TIMEOUT_S = 60.0  # per request: a real engine on a busy 2-core machine may answer late
MAX = 8  # tokens of every reply
PROMPT = "Tell me about llamas."
WEATHER_Q = "What is the weather in Paris?"
OPENAI_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
#: the targets whose count_tokens the engine answers: llama-server (`/apply-template` + `/tokenize`: the
#: emulator has no `/apply-template`, so it is estimated) and vLLM (its native count_tokens; the emulator's
#: `/tokenize` where it has no native route); SGLang, TabbyAPI, LMDeploy and Ollama adapters do not count
ENGINE_COUNTS = {"llama-server/real", "vllm/real", "vllm/emulator"}
#: Ollama 0.5.4 (the real one here) answers a streamed /api/chat that offers tools in one chunk, the whole
#: reply at the end (it waits to see whether the reply is a tool call): there the gateway has one delta to relay
ONE_CHUNK_WITH_TOOLS = {"ollama/real"}
OLLAMA_TOOLS_TEMPLATE = (
    "{{- if .Tools }}<|im_start|>system\nTools:{{ range .Tools }}\n{{ . }}{{ end }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}"
    '{{ range .ToolCalls }}\n<tool_call>{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}'
    "</tool_call>{{ end }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)


@pytest.fixture(scope="module", params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from open_target(request)


@contextlib.contextmanager
def upstream_model(target: Target) -> Iterator[str]:
    """The engine's model for these cases. The real Ollama's `tiny` has a chat template without tools, and
    Ollama refuses tools for such a model ("... does not support tools", a 400 the gateway relays): here it
    is the same weights (`FROM tiny`: Ollama runs one runner for both) with a ChatML template that renders
    the tools, the assistant's tool calls and the tool results, removed again at the end."""
    if not (target.real is not None and target.engine == "ollama"):
        yield target.model
        return
    name = f"{target.model}-tools"
    modelfile = f'FROM {target.model}\nTEMPLATE """{OLLAMA_TOOLS_TEMPLATE}"""\n'
    r = httpx.post(
        target.url + "/api/create", json={"model": name, "modelfile": modelfile, "stream": False}, timeout=TIMEOUT_S
    )
    assert r.status_code == 200, r.text
    try:
        yield name
    finally:
        httpx.request("DELETE", target.url + "/api/delete", json={"model": name}, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def gateway(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("gw-dialects")
    with upstream_model(target) as model:
        cfg = CONFIG.format(data=work / "data", **{**target.config_fields, "model": model})
        with GatewayProcess(cfg, work, startup_timeout=60) as gw:
            yield gw


@pytest.fixture
def oai(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


@pytest.fixture
def claude(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=TIMEOUT_S)


# -- OpenAI Responses ------------------------------------------------------------------------------------


def assert_answered(r: Any, max_tokens: int = MAX) -> None:
    """A Response the engine answered: text, usage both ways, and a status that says why it ended."""
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "m", r
    assert r.error is None, r.error
    assert r.output and {o.type for o in r.output} <= {"message", "function_call"}, r.output
    assert r.output_text or any(o.type == "function_call" for o in r.output), r.output
    assert r.usage is not None and r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= max_tokens, r.usage
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, r.usage
    if r.status == "incomplete":  # the engine stopped at the limit
        assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens", r
        assert r.usage.output_tokens == max_tokens, r.usage
    else:
        assert r.status == "completed" and r.incomplete_details is None, r


def read_stream(events: Iterable[Any]) -> tuple[list[str], list[str], Any]:
    """(event types, output_text deltas, the Response of the terminal event) of a Responses stream; the
    terminal event must be the last, and sequence numbers count up from 0."""
    kinds: list[str] = []
    deltas: list[str] = []
    seqs: list[int] = []
    final = None
    for ev in events:
        assert final is None, f"{ev.type} after the terminal event ({kinds})"
        kinds.append(ev.type)
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        elif ev.type in TERMINAL:
            final = ev.response
    assert final is not None, f"no terminal event: {kinds}"
    assert seqs == list(range(len(seqs))), seqs
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] == ("response.incomplete" if final.status == "incomplete" else "response.completed"), kinds
    return kinds, deltas, final


def min_deltas(target: Target, tools: bool) -> int:
    """Text deltas a streamed 8-token reply must come in: token by token from an emulator, not one buffered
    blob. A real engine may itself send several tokens in one chunk (vLLM coalesces its outputs when its API
    server falls behind on a busy machine; Ollama sends a reply with tools in one chunk): there one delta is
    enough, and the join must still equal the whole text."""
    if target.real is not None or (tools and target.id in ONE_CHUNK_WITH_TOOLS):
        return 1
    return 2


def assert_streamed_text(kinds: list[str], deltas: list[str], final: Any, at_least: int = 2) -> None:
    assert len(deltas) >= at_least, (deltas, kinds)
    assert "".join(deltas) == final.output_text, (deltas, final.output_text)
    assert kinds.count("response.output_text.done") == 1, kinds


def test_responses_whole(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model="m", input=PROMPT, max_output_tokens=MAX, temperature=0)
    assert_answered(r)
    assert [o.type for o in r.output] == ["message"] and r.output_text
    got = oai.responses.retrieve(r.id)  # stored (store defaults to true)
    assert got.id == r.id and got.output_text == r.output_text and got.status == r.status


def test_responses_streamed(oai: openai.OpenAI, target: Target) -> None:
    with oai.responses.stream(model="m", input=PROMPT, max_output_tokens=MAX, temperature=0) as s:
        kinds, deltas, final = read_stream(s)
    assert_answered(final)
    assert_streamed_text(kinds, deltas, final, min_deltas(target, tools=False))
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"], kinds
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    got = oai.responses.retrieve(final.id)  # stored before the stream's last event
    assert got.output_text == final.output_text and got.status == final.status


def test_responses_with_a_function_tool_offered(oai: openai.OpenAI) -> None:
    r = oai.responses.create(
        model="m",
        input=WEATHER_Q,
        tools=[OPENAI_TOOL],  # type: ignore[list-item]
        tool_choice="auto",
        max_output_tokens=MAX,
        temperature=0,
    )
    assert_answered(r)
    assert [t.name for t in r.tools] == ["get_weather"]  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_responses_with_a_function_call_output_in_the_input(oai: openai.OpenAI, target: Target, stream: bool) -> None:
    plain = oai.responses.create(model="m", input=WEATHER_Q, max_output_tokens=1, temperature=0, store=False)
    args: dict[str, Any] = {
        "model": "m",
        "input": [
            {"role": "user", "content": WEATHER_Q},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
        ],
        "tools": [OPENAI_TOOL],
        "max_output_tokens": MAX,
        "temperature": 0,
    }
    if stream:
        with oai.responses.create(stream=True, **args) as events:
            kinds, deltas, r = read_stream(events)
        assert_streamed_text(kinds, deltas, r, min_deltas(target, tools=True))
    else:
        r = oai.responses.create(**args)
    assert_answered(r)
    # the call and its output reached the engine: the prompt is longer than the question alone
    assert plain.usage is not None and r.usage is not None
    assert r.usage.input_tokens > plain.usage.input_tokens, (plain.usage, r.usage)


def test_responses_previous_response_id_chains(oai: openai.OpenAI, target: Target) -> None:
    first = oai.responses.create(model="m", input=PROMPT, max_output_tokens=MAX, temperature=0)
    assert_answered(first)
    with oai.responses.create(
        model="m", previous_response_id=first.id, input="Go on.", max_output_tokens=MAX, temperature=0, stream=True
    ) as events:
        kinds, deltas, second = read_stream(events)
    assert_answered(second)
    assert_streamed_text(kinds, deltas, second, min_deltas(target, tools=False))
    assert second.previous_response_id == first.id
    # the prompt holds the first exchange: the engine counted more input tokens
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens, (first.usage, second.usage)
    got = oai.responses.retrieve(second.id)  # GET /v1/responses/{id}
    assert got.id == second.id and got.previous_response_id == first.id
    assert got.output_text == second.output_text and got.usage == second.usage
    third = oai.responses.create(
        model="m", previous_response_id=second.id, input="And?", max_output_tokens=MAX, temperature=0
    )
    assert_answered(third)
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens


# -- Anthropic Messages ----------------------------------------------------------------------------------

USER = [{"role": "user", "content": PROMPT}]
ZERO = {"temperature": 0}  # a sampling field this SDK no longer types


def assert_message(msg: anthropic.types.Message, max_tokens: int = MAX) -> str:
    """A Message the engine answered; its text."""
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant", msg
    assert msg.model == "m", msg.model
    assert msg.content and {b.type for b in msg.content} <= {"text", "tool_use"}, msg.content
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= max_tokens, msg.usage
    if msg.stop_reason == "max_tokens":
        assert msg.usage.output_tokens == max_tokens, msg.usage
    else:
        assert msg.stop_reason in ("end_turn", "tool_use"), msg.stop_reason
    assert msg.stop_sequence is None
    return "".join(b.text for b in msg.content if b.type == "text")


def read_message_stream(stream: Any) -> tuple[list[str], list[str], anthropic.types.Message]:
    """(event types, text deltas, the final message) of `messages.stream()`, with Anthropic's order
    checked: message_start, then blocks (start, deltas, stop), then message_delta, message_stop."""
    kinds: list[str] = []
    texts: list[str] = []
    for ev in stream:
        if ev.type in ("text", "ping"):  # "text": the SDK's own convenience event; "ping": keep-alive
            continue
        kinds.append(ev.type)
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            texts.append(ev.delta.text)
    final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    open_block = False
    for k in kinds[1:-2]:
        if k == "content_block_start":
            assert not open_block, kinds
            open_block = True
        elif k in ("content_block_delta", "content_block_stop"):
            assert open_block, kinds
            open_block = k == "content_block_delta"
        else:
            raise AssertionError(f"{k} between message_start and message_delta: {kinds}")
    assert not open_block and "content_block_start" in kinds, kinds
    return kinds, texts, final


def test_messages_whole(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model="m", max_tokens=MAX, messages=USER, extra_body=ZERO)  # type: ignore[arg-type]
    assert [b.type for b in msg.content] == ["text"]
    assert assert_message(msg)


def test_messages_streamed(claude: anthropic.Anthropic, target: Target) -> None:
    with claude.messages.stream(model="m", max_tokens=MAX, messages=USER, extra_body=ZERO) as s:  # type: ignore[arg-type]
        kinds, texts, final = read_message_stream(s)
    text = assert_message(final)
    assert len(texts) >= min_deltas(target, tools=False), kinds  # token by token
    assert "".join(texts) == text and text, (texts, final.content)


def test_messages_with_tools_offered(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(
        model="m",
        max_tokens=MAX,
        messages=[{"role": "user", "content": WEATHER_Q}],
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "auto"},
        extra_body=ZERO,
    )
    assert_message(msg)


HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": WEATHER_Q},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
        ],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny"}]},
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_messages_tool_use_round_trip(claude: anthropic.Anthropic, target: Target, stream: bool) -> None:
    plain = claude.messages.create(
        model="m",
        max_tokens=1,
        messages=[{"role": "user", "content": WEATHER_Q}],
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        extra_body=ZERO,
    )
    args: dict[str, Any] = {
        "model": "m",
        "max_tokens": MAX,
        "messages": HISTORY,
        "tools": [ANTHROPIC_TOOL],
        "extra_body": ZERO,
    }
    if stream:
        with claude.messages.stream(**args) as s:
            _, texts, msg = read_message_stream(s)
        assert len(texts) >= min_deltas(target, tools=True), texts
        assert "".join(texts) == "".join(b.text for b in msg.content if b.type == "text")
    else:
        msg = claude.messages.create(**args)
    assert_message(msg)
    # the tool_use and its result reached the engine: the prompt is longer than the question alone
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > plain.usage.input_tokens + (
        plain.usage.cache_read_input_tokens or 0
    ), (plain.usage, msg.usage)


def test_messages_count_tokens(claude: anthropic.Anthropic, target: Target) -> None:
    raw = claude.messages.with_raw_response.count_tokens(model="m", system="Be brief.", messages=USER)  # type: ignore[arg-type]
    source = raw.headers.get("x-gateway-token-count")
    counted = raw.parse().input_tokens
    assert counted > 0
    assert source == ("engine" if target.id in ENGINE_COUNTS else "estimate"), (target.id, source, counted)
    if source == "engine":  # the engine's own count of the prompt its generation gets
        msg = claude.messages.create(model="m", max_tokens=1, system="Be brief.", messages=USER, extra_body=ZERO)  # type: ignore[arg-type]
        assert counted == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0), (counted, msg.usage)
    with_tools = claude.messages.count_tokens(
        model="m",
        system="Be brief.",
        messages=HISTORY,  # type: ignore[arg-type]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
    )
    assert with_tools.input_tokens > counted, (counted, with_tools)
