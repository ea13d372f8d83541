"""OpenAI's Responses API end to end with the unmodified `openai` SDK as the caller: the SDK -> the gateway as
a real process -> (a) a vLLM emulator: whole and streamed (`responses.create`, `responses.stream`), the
fields that map, `previous_response_id` chaining, `store` with GET / DELETE / input_items, a key that cannot
see another key's responses, stored responses surviving a restart (SQLite), errors as the SDK's typed
exceptions, the `endpoint` metric label; (b) the real llama-server with the tiny model (whole, streamed,
chained). The emulator never calls tools, so the SDK's reading of function calls (whole and streamed) is
shown against the gateway in-process, the engine played by a FakeUpstream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import orjson
import pytest
import sqlalchemy as sa

from llm_gateway.access.keys import digest_of
from llm_gateway.app import create_app
from llm_gateway_emulators import EmulatorConfig, EmulatorThread, expected_text
from tests.conftest import ONE_BACKEND, TEST_KEY, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.postgres_server import running_postgres
from tests.support.real_engines import RealEngine

ALICE = "sk-e2e-alice-0123456789"
BOB = "sk-e2e-bob-0123456789"
CONFIG = """
server: {{access_log: false, data_dir: "{data}"}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{alice}"}}
    - {{name: bob, sha256: "{bob}"}}
backends:
  - {{name: emu, engine: vllm, url: "{url}", api_key: emu-key, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny-public
    aliases: [tiny-alias]
    deployments: [{{backend: emu, model: tiny, format: safetensors, capabilities: [chat, tools, json_schema]}}]
  - name: small-window
    deployments: [{{backend: emu, model: tiny, format: safetensors, context_length: 64}}]
"""
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", api_key="emu-key")) as emu:
        yield emu


@pytest.fixture(scope="module")
def gateway(emulator: EmulatorThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("gw-responses")
    cfg = CONFIG.format(alice=digest_of(ALICE), bob=digest_of(BOB), url=emulator.url, data=work / "data")
    with GatewayProcess(cfg, work) as gw:
        yield gw


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=ALICE, max_retries=0, timeout=30)


def terminal(events: Iterator[Any]) -> tuple[list[str], Any]:
    """The event types of a stream, and the Response its terminal event carries. (The SDK's
    `get_final_response()` knows only `response.completed`; a response that stopped at
    `max_output_tokens` ends with `response.incomplete`, as OpenAI's own do.)"""
    kinds, final = [], None
    for ev in events:
        kinds.append(ev.type)
        if ev.type in ("response.completed", "response.incomplete", "response.failed"):
            final = ev.response
    assert final is not None, kinds
    return kinds, final


def sent(emulator: EmulatorThread) -> dict[str, Any]:
    """The OpenAI chat body the engine got for the last request."""
    last = emulator.stats.last_request
    assert last is not None and last["path"] == "/v1/chat/completions", last
    body: dict[str, Any] = last["json"]
    return body


# -- (a) the vLLM emulator ------------------------------------------------------------------------------------


def test_a_whole_response(client: openai.OpenAI, emulator: EmulatorThread) -> None:
    r = client.responses.create(model="tiny-public", input="Hello", max_output_tokens=8)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny-public"
    assert r.output_text == expected_text(8)
    assert [o.type for o in r.output] == ["message"]
    assert r.status == "incomplete" and r.incomplete_details is not None  # it stopped at max_output_tokens
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.output_tokens == 8 and r.usage.input_tokens > 0
    assert sent(emulator)["model"] == "tiny" and sent(emulator)["max_tokens"] == 8


def test_a_streamed_response_is_one_delta_per_token(client: openai.OpenAI) -> None:
    with client.responses.stream(model="tiny-alias", input="Hello", max_output_tokens=12) as stream:
        deltas: list[str] = []
        kinds, final = terminal(
            ev for ev in stream if not (ev.type == "response.output_text.delta" and deltas.append(ev.delta))
        )
    assert len(deltas) == 12 and "".join(deltas) == expected_text(12)
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert final.output_text == expected_text(12) and final.model == "tiny-public"
    assert final.usage is not None and final.usage.output_tokens == 12


def test_instructions_sampling_and_text_format_reach_the_engine(
    client: openai.OpenAI, emulator: EmulatorThread
) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    client.responses.create(
        model="tiny-public",
        instructions="Be terse.",
        input=[{"role": "user", "content": "Hi"}],
        max_output_tokens=4,
        temperature=0.2,
        top_p=0.5,
        text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
        store=False,
    )
    body = sent(emulator)
    assert body["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.2, 0.5, 4)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_previous_response_id_continues_the_conversation(
    client: openai.OpenAI, emulator: EmulatorThread, stream: bool
) -> None:
    first = client.responses.create(model="tiny-public", instructions="Old rules.", input="Hello", max_output_tokens=3)
    if stream:
        with client.responses.stream(
            model="tiny-public", previous_response_id=first.id, input="More", max_output_tokens=2
        ) as s:
            _, second = terminal(iter(s))
    else:
        second = client.responses.create(
            model="tiny-public", previous_response_id=first.id, input="More", max_output_tokens=2
        )
    # the earlier turn and its answer go first; its instructions do not carry over (as OpenAI has it)
    assert sent(emulator)["messages"] == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": expected_text(3)},
        {"role": "user", "content": "More"},
    ]
    assert second.previous_response_id == first.id
    third = client.responses.create(
        model="tiny-public", previous_response_id=second.id, input="End", max_output_tokens=1
    )
    assert len(sent(emulator)["messages"]) == 5 and third.output_text == expected_text(1)


def test_a_function_call_output_goes_back_as_a_tool_message(client: openai.OpenAI, emulator: EmulatorThread) -> None:
    client.responses.create(
        model="tiny-public",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C, sunny"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="auto",
        max_output_tokens=3,
    )
    body = sent(emulator)
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    ]
    assert body["tools"][0]["function"]["name"] == "get_weather" and body["tool_choice"] == "auto"


def test_stored_responses_get_list_delete_and_belong_to_their_key(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    r = client.responses.create(
        model="tiny-public", input=[{"role": "user", "content": "Keep me"}], max_output_tokens=2
    )
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    items = client.responses.input_items.list(r.id)
    assert [it.type for it in items.data] == ["message"]
    bob = openai.OpenAI(base_url=gateway.url + "/v1", api_key=BOB, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(r.id)  # another key's response does not exist for it
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError):  # previous_response_not_found
        bob.responses.create(model="tiny-public", previous_response_id=r.id, input="x", max_output_tokens=1)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model="tiny-public", input="x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_stored_responses_survive_a_restart(gateway: GatewayProcess, client: openai.OpenAI) -> None:
    r = client.responses.create(model="tiny-public", input="Remember", max_output_tokens=2)
    gateway.stop()
    gateway.start()
    got = openai.OpenAI(base_url=gateway.url + "/v1", api_key=ALICE, max_retries=0).responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == expected_text(2)


def test_input_tokens_are_counted_by_the_engines_tokenizer(client: openai.OpenAI, emulator: EmulatorThread) -> None:
    raw = client.responses.input_tokens.with_raw_response.count(
        model="tiny-public", instructions="Be brief.", input="Hello"
    )
    assert raw.headers["x-gateway-token-count"] == "engine"
    counted = raw.parse()
    assert counted.object == "response.input_tokens"
    # the emulator's chat count: 3 + per message (4 + ceil(len / 4)), the instructions a system message
    assert counted.input_tokens == 3 + (4 + 3) + (4 + 2)
    assert emulator.stats.last_request is not None and emulator.stats.last_request["path"] != "/v1/chat/completions"


def test_errors_are_the_sdks_typed_exceptions(gateway: GatewayProcess, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny-public", input="x", extra_body={"bogus": 1})
    assert e.value.body["param"] == "bogus"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny-public", input="x", tools=[{"type": "web_search"}])
    assert "not supported by this gateway" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny-public", input="x", previous_response_id="resp_nope")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-wrong-0000000", max_retries=0).responses.create(
            model="tiny-public", input="x"
        )
    raw = httpx.put(gateway.url + "/v1/responses/resp_x", headers={"authorization": f"Bearer {ALICE}"})
    assert raw.status_code == 405 and raw.headers["allow"] == "DELETE, GET"
    assert raw.json()["error"]["code"] == "method_not_allowed"


def _refs(*ids: str) -> list[dict[str, str]]:
    return [{"type": "item_reference", "id": i} for i in ids]


def test_item_references_are_the_items_the_gateway_stored_for_the_key(
    gateway: GatewayProcess, client: openai.OpenAI, emulator: EmulatorThread
) -> None:
    first = client.responses.create(
        model="tiny-public", input=[{"role": "user", "content": "Hello"}], max_output_tokens=3
    )
    asked = client.responses.input_items.list(first.id).data[0].id  # an input item the client sent
    said = first.output[0].id  # an output item
    with client.responses.stream(
        model="tiny-public",
        input=[*_refs(asked, said), {"role": "user", "content": "More"}],  # type: ignore[list-item]
        max_output_tokens=2,
    ) as s:
        _, second = terminal(iter(s))
    assert sent(emulator)["messages"] == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": expected_text(3)},
        {"role": "user", "content": "More"},
    ]
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [it.id for it in listed[:2]] == [asked, said]  # listed as the items they stand for
    # the second's new input item and its (streamed) output are stored by id in turn
    client.responses.create(
        model="tiny-public",
        input=_refs(asked, said, listed[2].id, second.output[0].id),  # type: ignore[arg-type]
        max_output_tokens=1,
        store=False,
    )
    assert [m["content"] for m in sent(emulator)["messages"]] == ["Hello", expected_text(3), "More", expected_text(2)]
    bob = openai.OpenAI(base_url=gateway.url + "/v1", api_key=BOB, max_retries=0)
    for who, ref in ((bob, asked), (client, "msg_unknown"), (bob, "msg_unknown")):
        with pytest.raises(openai.NotFoundError) as e:  # another key's item is one that does not exist
            who.responses.create(model="tiny-public", input=_refs(ref), max_output_tokens=1)  # type: ignore[arg-type]
        assert e.value.body == {
            "message": f"Item with id '{ref}' not found.",
            "type": "invalid_request_error",
            "param": "input",
            "code": None,
        }
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):  # a deleted response's items go with it
        client.responses.create(model="tiny-public", input=_refs(said), max_output_tokens=1)  # type: ignore[arg-type]


def test_a_previous_response_the_key_has_not_is_previous_response_not_found(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    deleted = client.responses.create(model="tiny-public", input="x", max_output_tokens=1)
    client.responses.delete(deleted.id)
    unstored = client.responses.create(model="tiny-public", input="x", max_output_tokens=1, store=False)
    bobs = openai.OpenAI(base_url=gateway.url + "/v1", api_key=BOB, max_retries=0).responses.create(
        model="tiny-public", input="x", max_output_tokens=1
    )
    for prev in ("resp_unknown", deleted.id, unstored.id, bobs.id):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="tiny-public", previous_response_id=prev, input="y", max_output_tokens=1)
        assert e.value.status_code == 400
        assert e.value.body == {  # OpenAI's (Codex and its proxies recover on the code)
            "message": f"Previous response with id '{prev}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }


def test_errors_of_the_chat_path_name_the_responses_parameters(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:  # the prompt alone is over the 64-token window
        client.responses.create(model="small-window", input="word " * 2000, max_output_tokens=10)
    body: Any = e.value.body
    assert (body["code"], body["param"]) == ("context_length_exceeded", "input")
    assert "max_output_tokens 10" in body["message"] and "max_tokens" not in body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny-public", input=[])
    body = e.value.body
    assert body["param"] == "input" and "'input'" in body["message"] and "messages" not in body["message"]


def test_an_early_400_is_counted_under_the_model_it_asked_for(gateway: GatewayProcess, client: openai.OpenAI) -> None:
    def count(model: str) -> float:
        text = httpx.get(gateway.url + "/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("gateway_requests_total{")
            and 'endpoint="responses"' in line
            and f'model="{model}"' in line
            and 'status_class="4xx"' in line
        )

    before, unknown = count("tiny-public"), count("unknown")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny-alias", input="x", extra_body={"bogus": 1})  # refused by the translation
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny-public", input="x", previous_response_id="resp_unknown")
    assert count("tiny-public") == before + 2  # the public model of the alias, as a served request is counted
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="not-served", input="x", extra_body={"bogus": 1})
    assert count("unknown") == unknown + 1  # a name the gateway does not serve is no label


def test_the_endpoint_label_counts_responses(gateway: GatewayProcess, client: openai.OpenAI) -> None:
    def count() -> float:
        text = httpx.get(gateway.url + "/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("gateway_requests_total{") and 'endpoint="responses"' in line
        )

    before = count()
    client.responses.create(model="tiny-public", input="x", max_output_tokens=1, store=False)
    assert count() == before + 1


# -- two replicas on one real Postgres ------------------------------------------------------------------------

REPLICA = """
server: {{access_log: false}}
database: {{url: "{db}"}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{alice}"}}
backends:
  - {{name: emu, engine: vllm, url: "{url}", api_key: emu-key, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny-public
    deployments: [{{backend: emu, model: tiny, format: safetensors}}]
"""


def test_replicas_on_one_postgres_share_stored_responses(
    emulator: EmulatorThread, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with running_postgres() as pg:
        cfg = REPLICA.format(db=pg.new_database(), alice=digest_of(ALICE), url=emulator.url)
        work = tmp_path_factory.mktemp("gw-replicas")
        with GatewayProcess(cfg, work, name="a") as a, GatewayProcess(cfg, work, name="b") as b:
            on_a = openai.OpenAI(base_url=a.url + "/v1", api_key=ALICE, max_retries=0, timeout=30)
            on_b = openai.OpenAI(base_url=b.url + "/v1", api_key=ALICE, max_retries=0, timeout=30)
            first = on_a.responses.create(model="tiny-public", input="Hello", max_output_tokens=3)
            assert on_b.responses.retrieve(first.id).output_text == expected_text(3)  # made on a, read on b
            second = on_b.responses.create(
                model="tiny-public", previous_response_id=first.id, input="More", max_output_tokens=2
            )
            assert sent(emulator)["messages"] == [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": expected_text(3)},
                {"role": "user", "content": "More"},
            ]
            on_b.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                on_a.responses.retrieve(first.id)  # deleted on b, gone on a
            assert on_a.responses.retrieve(second.id).previous_response_id == first.id
            logs = a.log_text() + b.log_text()
            assert "postgresql+asyncpg://gw:***@" in logs and pg.password not in logs  # never the password


# -- the SDK reading function calls (the engine played in-process) ---------------------------------------------


async def test_the_sdk_reads_function_calls_whole_and_streamed(tmp_path: Path) -> None:
    call = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}
    whole = {
        "id": "chatcmpl-t",
        "object": "chat.completion",
        "model": "upstream-model",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "Need weather.",
                    "tool_calls": [call],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39},
    }
    head = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "model": "upstream-model"}

    def ev(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

    frag = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    streamed = FakeAnswer.sse(
        ev([{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Need weather."}, "finish_reason": None}]),
        ev([{"index": 0, "delta": {"tool_calls": [frag]}, "finish_reason": None}]),
        ev([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}}]),
        ev([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Rome"}'}}]}}]),
        ev([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        ev([], usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}),
        b"data: [DONE]\n\n",
    )
    up = FakeUpstream({("POST", "http://engine-a.test/v1/chat/completions"): [FakeAnswer.json(whole), streamed]})
    cfg = ONE_BACKEND.replace("embeddings]}", "embeddings, tools]}").replace(
        "server: {access_log: false}", f'server: {{access_log: false, data_dir: "{tmp_path}"}}'
    )
    app = create_app(make_config(cfg), upstream=up, probes=False)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gateway.test")
    sdk = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key=TEST_KEY, http_client=http, max_retries=0)
    try:
        r = await sdk.responses.create(model="public-model", input="Weather?", tools=[WEATHER])  # type: ignore[list-item]
        async with sdk.responses.stream(model="public-model", input="Weather?", tools=[WEATHER]) as s:  # type: ignore[list-item]
            args = [e.delta async for e in s if e.type == "response.function_call_arguments.delta"]
            final = await s.get_final_response()
        again = await sdk.responses.retrieve(final.id)
    finally:
        await http.aclose()
        await app.context.responses.aclose()
        await app.gw.aclose()
    assert args == ['{"city":', '"Rome"}']
    for resp in (r, final, again):
        assert [o.type for o in resp.output] == ["reasoning", "function_call"]
        fc = resp.output[1]
        assert fc.type == "function_call"
        assert (fc.call_id, fc.name, fc.arguments) == ("call_7", "get_weather", '{"city":"Rome"}')
        assert resp.usage is not None and (resp.usage.input_tokens, resp.usage.output_tokens) == (30, 9)
        assert resp.status == "completed"
    up.assert_all_closed()


async def test_references_cost_one_query_and_a_request_without_them_none(tmp_path: Path) -> None:
    """The store is read for references only when the input has some, and then once for all of them."""
    answer = {
        "id": "chatcmpl-r",
        "object": "chat.completion",
        "model": "upstream-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Yes."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    up = FakeUpstream({("POST", "http://engine-a.test/v1/chat/completions"): [FakeAnswer.json(answer)] * 3})
    cfg = ONE_BACKEND.replace("server: {access_log: false}", f'server: {{access_log: false, data_dir: "{tmp_path}"}}')
    app = create_app(make_config(cfg), upstream=up, probes=False)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gateway.test")
    sdk = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key=TEST_KEY, http_client=http, max_retries=0)
    try:
        first = await sdk.responses.create(
            model="public-model", input=[{"role": "user", "content": "A"}, {"role": "user", "content": "B"}]
        )
        store = app.context.responses.store
        assert store is not None
        seen: list[str] = []
        sa.event.listen(store.db.engine.sync_engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
        await sdk.responses.create(model="public-model", input=[{"role": "user", "content": "no references"}])
        assert not [q for q in seen if q.lstrip().upper().startswith("SELECT")]  # only the save's inserts
        seen.clear()
        ids = [it.id for it in (await sdk.responses.input_items.list(first.id, order="asc")).data]
        seen.clear()
        await sdk.responses.create(model="public-model", input=_refs(*ids, first.output[0].id), store=False)  # type: ignore[arg-type]
        assert len([q for q in seen if q.lstrip().upper().startswith("SELECT")]) == 1
        sent_messages = up.calls[-1].json()["messages"]
        assert sent_messages == [
            {"role": "user", "content": "A"},
            {"role": "user", "content": "B"},
            {"role": "assistant", "content": "Yes."},
        ]
    finally:
        await http.aclose()
        await app.context.responses.aclose()
        await app.gw.aclose()
    up.assert_all_closed()


# -- (b) the real llama-server --------------------------------------------------------------------------------

LLAMA_CONFIG = """
server: {{access_log: false, data_dir: "{data}"}}
auth: {{mode: none}}
backends:
  - {{name: llama, engine: llama-server, url: "{url}", api_key: "{key}", capacity: 1, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments: [{{backend: llama, model: "{model}", format: gguf}}]
"""


def test_the_real_llama_server_whole_streamed_and_chained(
    llama_server: RealEngine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work = tmp_path_factory.mktemp("gw-responses-llama")
    cfg = LLAMA_CONFIG.format(url=llama_server.url, key=llama_server.api_key, model=llama_server.model, data=work / "d")
    with GatewayProcess(cfg, work) as gw:
        sdk = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = sdk.responses.create(model="tiny", input="Hello", max_output_tokens=6, temperature=0)
        assert r.status == "incomplete" and r.output_text  # the tiny model never stops on its own
        assert r.usage is not None and r.usage.output_tokens == 6
        with sdk.responses.stream(model="tiny", previous_response_id=r.id, input="Go on", max_output_tokens=5) as s:
            deltas: list[str] = []
            _, final = terminal(e for e in s if not (e.type == "response.output_text.delta" and deltas.append(e.delta)))
        assert len(deltas) >= 2 and "".join(deltas) == final.output_text
        assert final.usage is not None and final.usage.output_tokens == 5
        # the chained prompt holds the first exchange: the engine counted more input tokens
        assert final.usage.input_tokens > r.usage.input_tokens
