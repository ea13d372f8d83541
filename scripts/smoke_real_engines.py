#!/usr/bin/env python3
"""Smoke-check the real engines through ``tests/support/real_engines.py``.

    usage: .venv/bin/python scripts/smoke_real_engines.py [llama] [vllm] [ollama] [--install]

For each engine: start it on a free port, send one non-streaming and one streaming chat
completion with httpx, read ``/metrics`` (llama-server, vLLM) or ``/api/ps`` (Ollama), print
start-up time and RSS, and stop it. Exits non-zero on the first failure. ``--install`` lets the
launchers install a missing engine (otherwise a missing engine is reported and skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.real_engines import (
    EngineNotInstalled,
    LlamaServer,
    OllamaServer,
    RealEngine,
    VllmServer,
)


def check(eng: RealEngine, status_path: str) -> None:
    """Run the chat/stream/status checks against a started engine."""
    body = {
        "model": eng.model,
        "messages": [{"role": "user", "content": "Say hello"}],
        "max_tokens": 16,
        "temperature": 0,
    }
    with httpx.Client(base_url=eng.url, headers=eng.headers, timeout=120) as c:
        t0 = time.monotonic()
        r = c.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        choice = r.json()["choices"][0]
        print(
            f"  chat: {time.monotonic() - t0:.2f}s finish={choice['finish_reason']} "
            f"content={choice['message']['content']!r}"
        )
        t0 = time.monotonic()
        deltas: list[str] = []
        done = False
        with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            s.raise_for_status()
            for line in s.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                for ch in json.loads(line[6:]).get("choices", []):
                    deltas.append(ch.get("delta", {}).get("content") or "")
        text = "".join(deltas)
        print(f"  stream: {time.monotonic() - t0:.2f}s chunks={len(deltas)} [DONE]={done} text={text!r}")
        assert done and text, "stream had no text or no [DONE]"
        r = c.get(status_path)
        r.raise_for_status()
        print(f"  GET {status_path}: {r.status_code}, {len(r.text)} bytes")
    print(f"  rss={eng.rss_bytes() / 2**20:.0f} MiB (engine process group), log={eng.log_path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", nargs="*", default=["llama", "vllm", "ollama"])
    ap.add_argument("--install", action="store_true", help="install missing engines")
    a = ap.parse_args()
    makers: dict[str, tuple[Callable[..., RealEngine], str]] = {
        "llama": (LlamaServer, "/metrics"),
        "vllm": (VllmServer, "/metrics"),
        "ollama": (OllamaServer, "/api/ps"),
    }
    for name in a.engines:
        cls, status_path = makers[name]
        print(f"{name}:")
        eng = cls(install=a.install or None)
        try:
            eng.start()
        except EngineNotInstalled as exc:
            print(f"  SKIPPED: {exc}")
            continue
        try:
            print(f"  started pid={eng.pid} url={eng.url} model={eng.model} in {eng.startup_seconds:.1f}s")
            check(eng, status_path)
        finally:
            rc = eng.stop()
            print(f"  stopped, exit code {rc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
