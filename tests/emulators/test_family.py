"""The emulators of issue 39's engines (Aphrodite, trtllm-serve, TGI, MLC LLM, LM Studio, Dynamo) play what
each engine's source says it does: each case names the behaviour and the module docstring that cites it."""

from __future__ import annotations

import httpx
import orjson
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread

HI = [{"role": "user", "content": "hi"}]


def emu(engine: str, **knobs: object) -> EmulatorThread:
    return EmulatorThread(EmulatorConfig(engine=engine, model="tiny", **knobs))  # type: ignore[arg-type]


def chat(url: str, headers: dict[str, str] | None = None, **extra: object) -> httpx.Response:
    body = {"model": "tiny", "messages": HI, "max_tokens": 3, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_trtllm_forbids_unknown_fields_and_both_names_of_the_limit() -> None:
    with emu("trtllm") as e:
        r = chat(e.url, mirostat_tau=5.0)
        assert r.status_code == 400 and "extra_forbidden" in r.json()["error"]
        r = chat(e.url, max_completion_tokens=3)  # max_tokens is its alias: both is an extra field
        assert r.status_code == 400 and "max_completion_tokens" in r.json()["error"]
        r = chat(e.url, stream_options={"include_usage": True})
        assert r.status_code == 400 and "stream_options can only be set if stream is true" in r.json()["error"]
        assert chat(e.url, model="anything").status_code == 200  # the model is not checked
        assert httpx.get(e.url + "/metrics").json() == []  # JSON iteration stats, not Prometheus


def test_mlc_error_is_serialised_twice_and_an_unknown_model_is_400() -> None:
    with emu("mlc") as e:
        r = chat(e.url, model="other")
        assert r.status_code == 400 and isinstance(r.json(), str)
        inner = orjson.loads(r.json())
        assert inner == {"object": "error", "message": 'The requested model "other" is not served.', "code": 400}
        r = chat(e.url, stream_options={"include_usage": True})
        assert r.status_code == 422 and "stream must be set to True" in r.text
        assert httpx.get(e.url + "/health").status_code == 404  # no health route


def test_tgi_auth_guards_generation_only_and_usage_chunk_has_an_empty_id() -> None:
    with emu("tgi", api_key="k") as e:
        r = chat(e.url)
        assert r.status_code == 401 and r.content == b""  # a bare 401
        assert httpx.get(e.url + "/v1/models").json()["data"][0] == {
            "id": "tiny",
            "object": "model",
            "created": 0,
            "owned_by": "tiny",
        }
        auth = {"Authorization": "Bearer k"}
        r = chat(e.url, auth, model="ignored", stream=True, stream_options={"include_usage": True})
        events = [orjson.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        assert events[-1]["choices"] == [] and events[-1]["id"] == ""
        r = chat(e.url, auth, max_completion_tokens=2)
        assert r.status_code == 422 and r.json()["error_type"] == "validation"


def test_dynamo_answers_529_when_its_queue_is_full_and_flat_404_for_an_unknown_model() -> None:
    with emu("dynamo", slots=0, max_queue=0) as e:
        r = chat(e.url)
        assert r.status_code == 529 and r.json() == {
            "message": "Service temporarily overloaded",
            "type": r.json()["type"],
            "code": 529,
        }
    with emu("dynamo") as e:
        assert chat(e.url, model="x").json() == {"message": "Model not found", "type": "Not Found", "code": 404}
        assert httpx.get(e.url + "/live").status_code == 200
        assert httpx.get(e.url + "/v1/models").json()["data"][0]["context_window"] == 4096


def test_lmstudio_native_listing_names_the_loaded_instance_and_its_window() -> None:
    with emu("lmstudio", ctx_len=8192) as e:
        models = httpx.get(e.url + "/api/v1/models").json()["models"]
        assert models[0]["loaded_instances"] == [{"id": "tiny", "config": {"context_length": 8192}}]
        assert chat(e.url, model="nope").json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("engine", ["aphrodite"])
def test_aphrodite_is_vllm_with_its_own_names(engine: str) -> None:
    with emu(engine) as e:
        assert httpx.get(e.url + "/v1/models").json()["data"][0]["owned_by"] == "aphrodite"
        text = httpx.get(e.url + "/metrics").text
        assert "aphrodite:num_requests_running" in text and "vllm:" not in text
