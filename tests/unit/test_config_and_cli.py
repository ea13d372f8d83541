"""Config loading (file/field/line errors, ${VAR}, environment overrides) and the CLI commands."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import orjson
import pytest

from llm_gateway.cli import main
from llm_gateway.settings.loader import ConfigError, load_config, parse_config
from tests.conftest import ONE_BACKEND, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

GOOD = """
backends:
  - name: b
    engine: vllm
    url: ${ENGINE_URL:-http://127.0.0.1:8000}
    api_key: ${ENGINE_KEY}
models:
  - name: m
    deployments:
      - {backend: b, model: x, format: safetensors}
"""


def test_var_references_are_expanded_from_the_environment() -> None:
    cfg = parse_config(GOOD, "g.yaml", {"ENGINE_KEY": "k1"})
    assert cfg.backends[0].url == "http://127.0.0.1:8000"
    assert cfg.backends[0].api_key is not None and cfg.backends[0].api_key.get_secret_value() == "k1"
    assert "k1" not in repr(cfg)


def test_a_missing_variable_names_the_file_field_and_line() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(GOOD, "g.yaml", {})
    assert str(ei.value) == "g.yaml:6: backends[0].api_key: environment variable ENGINE_KEY is not set"


@pytest.mark.parametrize(
    "text, where",
    [
        (GOOD.replace("engine: vllm", "engine: vllmx"), "g.yaml:4: backends[0].engine"),
        (GOOD.replace("format: safetensors", "format: exl3"), "g.yaml:10: models[0].deployments[0].format"),
        (GOOD.replace("model: x,", "modle: x,"), "g.yaml:10: models[0].deployments[0].modle: unknown field"),
        (
            GOOD.replace("backend: b,", "backend: nope,"),
            "g.yaml:10: models[0].deployments[0].backend: no backend named 'nope'",
        ),
        ("server: {port: 99999}\n", "g.yaml:1: server.port"),
        ("models: [\n", "g.yaml:2: invalid YAML"),
        ("- just\n- a list\n", "g.yaml:1: the config must be a mapping"),
    ],
)
def test_a_wrong_config_names_file_field_and_line(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(text, "g.yaml", {"ENGINE_KEY": "k"})
    assert where in str(ei.value), str(ei.value)


def test_format_on_an_engine_that_cannot_load_it_is_rejected_with_what_it_loads() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_config(GOOD.replace("engine: vllm", "engine: tabbyapi"), "g.yaml", {"ENGINE_KEY": "k"})
    assert "cannot load 'safetensors' weights; it loads exl2, exl3" in str(ei.value)


def test_environment_overrides_win_over_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_SERVER__PORT", "9123")
    monkeypatch.setenv("GATEWAY_LIMITS__DEFAULT_MAX_TOKENS", "77")
    cfg = parse_config("server: {port: 8000}\n" + GOOD, "g.yaml", {"ENGINE_KEY": "k"})
    assert cfg.server.port == 9123 and cfg.limits.default_max_tokens == 77


def test_duplicate_names_are_rejected() -> None:
    text = GOOD + "  - name: m\n    deployments: [{backend: b, model: y, format: safetensors}]\n"
    with pytest.raises(ConfigError, match="duplicate model name or alias: 'm'"):
        parse_config(text, "g.yaml", {"ENGINE_KEY": "k"})


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[2].glob("config/*.yaml")))
def test_every_example_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.models and cfg.backends


def test_check_config_prints_the_routing_table(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "config/all-engines.yaml"
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    for kind in ("llama-server", "vllm", "sglang", "ollama", "tabbyapi", "lmdeploy", "openai"):
        assert re.search(rf"\({kind} at http", out), kind
    assert "llama-3.1-8b (aliases: llama-8b)  strategy: least_load  fallbacks: qwen-2.5-7b" in out
    assert "-> Qwen2.5-7B-exl3-4.0bpw" in out and "exl3" in out


def test_check_config_fails_with_the_message_and_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINE_KEY", "k")
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("engine: vllm", "engine: nope"))
    assert main(["check-config", str(bad)]) == 1
    assert f"{bad}:4: backends[0].engine" in capsys.readouterr().err


def test_keys_new_prints_a_key_once_with_the_config_entry_of_its_digest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "team-a", "--models", "llama-*", "--rpm", "60"]) == 0
    out = capsys.readouterr().out
    key = re.search(r"^  (sk-gw-\S+)$", out, re.M)
    assert key is not None
    digest = hashlib.sha256(key.group(1).encode()).hexdigest()
    entry = out.split("add this under auth.keys in the config:\n", 1)[1]
    assert f"sha256: {digest}" in entry and key.group(1) not in entry
    cfg = parse_config("auth:\n  keys:\n" + "".join("    " + ln + "\n" for ln in entry.splitlines()), "k.yaml", {})
    assert cfg.auth.keys[0].name == "team-a" and cfg.auth.keys[0].limits.rpm == 60


async def test_one_json_access_log_line_per_request_without_prompt_or_key(caplog: pytest.LogCaptureFixture) -> None:
    cfg = make_config(ONE_BACKEND.replace("access_log: false", "access_log: true"))
    answer = FakeAnswer.json(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "upstream-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    )
    up = FakeUpstream({("POST", "http://engine-a.test/v1/chat/completions"): answer})
    caplog.set_level(logging.INFO, logger="gateway.access")
    async with gateway_client(cfg, upstream=up) as (client, _):
        await client.post(
            "/v1/chat/completions",
            headers={"x-request-id": "req-1"},
            json={"model": "pm", "messages": [{"role": "user", "content": "SECRET PROMPT TEXT"}]},
        )
    lines = [r for r in caplog.records if r.name == "gateway.access"]
    assert len(lines) == 1
    fields = lines[0].fields  # type: ignore[attr-defined]
    assert {
        k: fields[k]
        for k in ("request_id", "key", "model", "backend", "engine", "status", "prompt_tokens", "completion_tokens")
    } == {
        "request_id": "req-1",
        "key": "alice",
        "model": "public-model",
        "backend": "engine-a",
        "engine": "vllm",
        "status": 200,
        "prompt_tokens": 3,
        "completion_tokens": 1,
    }
    assert fields["duration_ms"] >= 0 and fields["overhead_ms"] >= 0
    from llm_gateway.observability.logs import JsonFormatter

    text = JsonFormatter().format(lines[0])
    assert orjson.loads(text)["request_id"] == "req-1"
    assert "SECRET PROMPT TEXT" not in text and "sk-test" not in text
