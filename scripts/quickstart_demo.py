#!/usr/bin/env python3
"""One chat completion through the gateway with the unmodified `openai` SDK: whole, then streamed."""

from __future__ import annotations

import sys

from openai import OpenAI


def main() -> None:
    base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/v1"
    client = OpenAI(base_url=base_url, api_key="not-needed-in-auth-none-mode")
    print(f"models at {base_url}: {[m.id for m in client.models.list()]}")
    messages = [{"role": "user", "content": "Say hello to the gateway."}]
    r = client.chat.completions.with_raw_response.create(model="tiny-llama", messages=messages, max_tokens=24)
    c = r.parse()
    print(
        f"\nchat completion via backend {r.headers.get('x-gateway-backend')} "
        f"({r.headers.get('x-gateway-engine')}), gateway overhead {r.headers.get('x-gateway-overhead-ms')} ms:"
    )
    print(f"  {c.choices[0].message.content!r}  finish_reason={c.choices[0].finish_reason}  usage={c.usage}")
    print("\nstreamed, chunk by chunk:")
    stream = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=24, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(f"  chunk: {chunk.choices[0].delta.content!r}")
        if chunk.usage:
            print(f"  usage: {chunk.usage}")


if __name__ == "__main__":
    main()
