"""Inter-token latencies are observed in batches (observability/metrics.observe_many): the histogram a
stream leaves must be exactly the one observing each gap would leave, and every gap of a stream counts.
The request path's single counts and observations go straight to the children's values (`inc`,
`observe`): the series must be the ones prometheus-client's own `inc` and `observe` leave.
"""

from __future__ import annotations

import random

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from llm_gateway.observability.metrics import DURATION_BUCKETS, ITL_BUCKETS, inc, observe, observe_many
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


@pytest.mark.parametrize(
    "values",
    [
        [0.03] * 9,  # a steady pace: every gap in one bucket, a middle one
        [0.025, 0.02, 0.011],  # one bucket, its own bound included
        [0.01, 0.01],  # on a bound: that bound's bucket, not the next
        [0.0001, 0.0004],  # the first bucket
        [11.0, 1e9],  # only +Inf
        [0.03, 0.03, 0.051],  # the smallest value's bucket and the next
        [0.003, 4.0],  # two buckets far apart, those below the first empty
    ],
    ids=["steady", "own-bound", "on-bound", "first", "inf", "next", "apart"],
)
def test_a_batch_that_starts_above_the_first_bucket_counts_as_one_at_a_time(values: list[float]) -> None:
    one, many = (Histogram("h", "h", ["m"], buckets=ITL_BUCKETS, registry=CollectorRegistry()) for _ in range(2))
    for v in values:
        one.labels("x").observe(v)
    observe_many(many.labels("x"), values)
    assert samples(many) == pytest.approx(samples(one))


def test_the_direct_inc_and_observe_leave_the_series_prometheus_clients_own_leave() -> None:
    rng = random.Random(11)
    values = [rng.choice(DURATION_BUCKETS) for _ in range(40)] + [rng.uniform(0, 900) for _ in range(200)] + [0.0]
    own, direct = (Histogram("h", "h", ["m"], buckets=DURATION_BUCKETS, registry=CollectorRegistry()) for _ in range(2))
    own_c, direct_c = (Counter("c", "c", ["m"], registry=CollectorRegistry()) for _ in range(2))
    for v in values:
        own.labels("x").observe(v)
        observe(direct.labels("x"), v)
        own_c.labels("x").inc(int(v))
        inc(direct_c.labels("x"), int(v))
    own_c.labels("y").inc()
    inc(direct_c.labels("y"))
    got, want = samples(direct), samples(own)
    assert got.keys() == want.keys() and sum(want.values()) > 0
    for k, v in want.items():
        assert abs(got[k] - v) < 1e-6, k
    counts = [
        {s.labels["m"]: s.value for m in c.collect() for s in m.samples if s.name == "c_total"}
        for c in (own_c, direct_c)
    ]
    assert counts[0] == counts[1] and counts[0]["y"] == 1


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


def test_the_request_paths_children_keep_their_counts_on_lock_free_values() -> None:
    from prometheus_client import Gauge, generate_latest

    from llm_gateway.observability.metrics import Metrics
    from llm_gateway.observability.prometheus_private import LoopValue

    m = Metrics()
    own = Metrics()  # prometheus-client's own children and methods, for the same series
    m.requests.labels("a", "b", "vllm", "chat", "2xx", "success").inc(3)  # made before `child` saw it: kept
    own.requests.labels("a", "b", "vllm", "chat", "2xx", "success").inc(3)
    req = m.child(m.requests, "a", "b", "vllm", "chat", "2xx", "success")
    assert isinstance(req._value, LoopValue) and m.child(m.requests, "a", "b", "vllm", "chat", "2xx", "success") is req
    inc(req, 2)
    own.requests.labels("a", "b", "vllm", "chat", "2xx", "success").inc(2)
    ttft = m.child(m.ttft, "a", "b")
    assert isinstance(ttft._sum, LoopValue) and all(isinstance(b, LoopValue) for b in ttft._buckets)
    for v in (0.0004, 0.003, 0.003, 7.0):
        observe(ttft, v)
        own.ttft.labels("a", "b").observe(v)
    observe_many(m.child(m.itl, "a", "b"), [0.01, 0.2, 0.2])
    for v in (0.01, 0.2, 0.2):
        own.itl.labels("a", "b").observe(v)
    ttft.observe(0.5)  # prometheus-client's own method works on the values too
    own.ttft.labels("a", "b").observe(0.5)

    def series(x: Metrics) -> list[str]:
        return sorted(line for line in generate_latest(x.registry).decode().splitlines() if "timestamp" not in line)

    assert series(m) == series(own)
    assert (
        'gateway_requests_total{backend="b",endpoint="chat",engine="vllm",model="a",outcome="success",'
        'status_class="2xx"} 5.0' in series(m)
    )
    with pytest.raises(TypeError):
        m.child(Gauge("g", "g", ["x"], registry=CollectorRegistry()), "y")
