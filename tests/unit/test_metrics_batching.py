"""Inter-token latencies are observed in batches (observability/metrics.observe_many): the histogram a
stream leaves must be exactly the one observing each gap would leave, and every gap of a stream counts.
"""

from __future__ import annotations

import random

import orjson
from prometheus_client import CollectorRegistry, Histogram

from llm_gateway.observability.metrics import ITL_BUCKETS, observe_many
from tests.conftest import ONE_BACKEND, TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream


def samples(h: Histogram) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("le", "")): s.value for m in h.collect() for s in m.samples if s.name != "h_created"}


def test_a_batch_leaves_the_histogram_that_one_observation_at_a_time_leaves() -> None:
    rng = random.Random(7)
    values = [rng.choice(ITL_BUCKETS) for _ in range(50)]  # on the bounds themselves: `<=` decides
    values += [rng.uniform(0, 20) for _ in range(200)] + [0.0, 1e9]  # between them, and past the last
    one, many = (Histogram("h", "h", ["m"], buckets=ITL_BUCKETS, registry=CollectorRegistry()) for _ in range(2))
    for v in values:
        one.labels("x").observe(v)
    observe_many(many.labels("x"), values[:100])
    observe_many(many.labels("x"), values[100:])
    observe_many(many.labels("x"), [])
    got, want = samples(many), samples(one)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert abs(got[k] - v) < 1e-6, k


def chunk(text: str, finish: str | None = None) -> bytes:
    delta = {"content": text} if text else {}
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "upstream-model"}
    body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def test_every_gap_between_a_streams_chunks_is_counted_past_one_batch() -> None:
    n = 150  # more than one batch of 64 gaps, and a partial batch at the end
    parts = [chunk(f"t{i} ") for i in range(n)] + [chunk("", "stop"), b"data: [DONE]\n\n"]
    up = FakeUpstream({("POST", "/v1/chat/completions"): FakeAnswer.sse(*parts)})
    async with gateway_client(make_config(ONE_BACKEND), upstream=up) as (client, app):
        body = {"model": "public-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        r = await client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {TEST_KEY}"})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        text = app.gw.metrics.render().decode()
    line = next(x for x in text.splitlines() if x.startswith("gateway_inter_token_latency_seconds_count{"))
    # one gap after each relayed write but the first that carried output; the finish chunk and [DONE]
    # leave in writes of their own (the fake engine sends every part as a chunk of its own)
    assert float(line.rsplit(" ", 1)[1]) == n + 1
