"""reasoning_tokens: each engine puts reasoning in its own field (reference table, row "Reasoning field")."""

from __future__ import annotations

import pytest
from emu_helpers import chat, request, running

from llm_gateway_emulators import expected_text

pytestmark = pytest.mark.asyncio

FIELDS = [
    ("llama-server", "reasoning_content"),
    ("vllm", "reasoning"),
    ("sglang", "reasoning_content"),
    ("ollama", "reasoning"),
    ("tabbyapi", "reasoning_content"),
    ("lmdeploy", "reasoning_content"),
]


@pytest.mark.parametrize(("engine", "field"), FIELDS)
async def test_reasoning_field_stream_and_nonstream(engine: str, field: str) -> None:
    async with running(engine, reasoning_tokens=3) as emu:
        body = (await request(emu.url, "POST", "/v1/chat/completions", chat(5))).json()
        message = body["choices"][0]["message"]
        assert message[field] == expected_text(3) and message["content"] == expected_text(2)
        sep = b"\r\n\r\n" if engine == "tabbyapi" else b"\n\n"
        data = (await request(emu.url, "POST", "/v1/chat/completions", chat(5, True))).data(sep)
        deltas = [d["choices"][0]["delta"] for d in data if isinstance(d, dict) and d.get("choices")]
        assert "".join(d.get(field) or "" for d in deltas) == expected_text(3)
        assert "".join(d.get("content") or "" for d in deltas) == expected_text(2)


async def test_ollama_native_thinking() -> None:
    async with running("ollama", reasoning_tokens=2) as emu:
        req = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": 4}}
        lines = (await request(emu.url, "POST", "/api/chat", req)).ndjson()
        assert "".join(x["message"].get("thinking", "") for x in lines) == expected_text(2)
        final = (await request(emu.url, "POST", "/api/chat", {**req, "stream": False})).json()
        assert final["message"]["thinking"] == expected_text(2) and final["eval_count"] == 4
