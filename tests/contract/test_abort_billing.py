"""A client that leaves in the middle of a stream still pays for what was generated.

The engine never sends its usage for a stream whose client left (the gateway closes the upstream
first), so the gateway settles the key's token budget with its own estimate of what it relayed. A key
with a TPM limit streams a long generation, reads some chunks and leaves; then:

- the engine stopped the generation (the contract's evidence: `Target.assert_stopped`);
- the key was charged exactly what the gateway recorded for the request (its prompt and completion
  token counters), read back from the key's own `x-ratelimit-remaining-tokens`: a request too large
  for the limit is refused before anything is reserved, and its 429 carries what is left;
- the completion charged is at least what the client itself received (so more than the prompt alone)
  and at most what the engine says it generated, by its own counter (with the estimate's slack), and
  far from the reservation (prompt + max_tokens).

Against real llama-server and vLLM (one token per SSE event, though vLLM merges tokens into one
event when its frontend falls behind), and against vLLM and SGLang emulators that put four tokens in
each event (`--stream-interval 4`): counting events alone bills a quarter of those.

An engine that aborts the generation itself (SGLang, LMDeploy, vLLM: `finish_reason: "abort"`, the
emulators' `engine_abort` fault) is answered with an error, never a complete answer, and the key still
pays: a whole answer is a 502 `generation_failed` charged the engine's own usage; a stream ends with
an error event and is charged the text it relayed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_gateway.access.keys import digest_of
from llm_gateway_emulators import VOCAB
from tests.contract.targets import Target, emulated, open_target, poll
from tests.support.gateway_process import GatewayProcess

KEY = "sk-contract-billing-0123456789"
TPM = 1_000_000
TOKENS_PER_EVENT = 4
READ_CHUNKS = 20  # content chunks the client reads before it leaves
TARGETS = ["llama-server/real", "vllm/real", "vllm/emulator", "sglang/emulator"]
CONFIG = """
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: payer, sha256: "{sha}", limits: {{tpm: {tpm}}}}}
routing: {{retries: 0}}
backends:
  - {{name: good, engine: {engine}, url: "{url}", api_key: "{key}", probe: {{interval_s: 0.5}}}}
models:
  - {{name: m, deployments: [{{backend: good, model: "{model}", format: {fmt}}}]}}
"""
MSG = [{"role": "user", "content": "Tell me about llamas."}]
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module", params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from open_target(request, tokens_per_event=TOKENS_PER_EVENT)


@pytest.fixture(scope="module")
def gateway(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(sha=digest_of(KEY), tpm=TPM, **target.config_fields)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-billing"), startup_timeout=60) as gw:
        yield gw


def tokens_left(gw: GatewayProcess) -> int:
    """The key's tokens left in its window, without spending any: a request larger than the whole
    limit is refused before anything is reserved, with the quota headers."""
    body = {"model": "m", "messages": MSG, "max_tokens": TPM + 1}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 429, r.text
    return int(r.headers["x-ratelimit-remaining-tokens"])


def recorded(gw: GatewayProcess) -> tuple[float, float, float]:
    """(requests answered by the backend, prompt tokens, completion tokens) the gateway has counted for
    model m; the refused meter readings have no backend."""
    out = {"gateway_requests": 0.0, "gateway_prompt_tokens": 0.0, "gateway_completion_tokens": 0.0}
    for fam in text_string_to_metric_families(httpx.get(gw.url + "/metrics", timeout=30).text):
        if fam.name in out:
            out[fam.name] += sum(
                s.value
                for s in fam.samples
                if s.name.endswith("_total") and s.labels["model"] == "m" and s.labels["backend"] == "good"
            )
    return out["gateway_requests"], out["gateway_prompt_tokens"], out["gateway_completion_tokens"]


def emulator_tokens(text: str) -> int:
    """How many of the emulator's tokens make `text` (it cycles VOCAB in order)."""
    n, acc = 0, ""
    while len(acc) < len(text):
        acc += VOCAB[n % len(VOCAB)]
        n += 1
    assert acc == text, (acc, text)
    return n


def test_a_client_that_leaves_pays_for_what_was_generated(gateway: GatewayProcess, target: Target) -> None:
    assert tokens_left(gateway) == TPM  # nothing charged yet
    requests0, prompt0, completion0 = recorded(gateway)
    max_tokens = target.long_tokens()
    body = {"model": "m", "messages": MSG, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    with target.paced():
        before = target.work()
        with (
            httpx.Client(timeout=60) as c,
            c.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=AUTH) as r,
        ):
            assert r.status_code == 200, r.read()
            chunks, text = target.read_while_generating(r.iter_lines(), READ_CHUNKS)
        after = target.assert_stopped(before, max_tokens)
    # the request's tokens are counted once it is over, after the key's budget was settled
    assert poll(lambda: recorded(gateway)[0] > requests0, 30), "the gateway never recorded the aborted stream"
    _, prompt1, completion1 = recorded(gateway)
    prompt, completion = prompt1 - prompt0, completion1 - completion0
    charged = TPM - tokens_left(gateway)
    generated = after.tokens - before.tokens  # by the engine's own count
    received = emulator_tokens(text) if target.emulator is not None else chunks  # real: >= one token a chunk
    facts = f"charged {charged}, prompt {prompt}, completion {completion}, received {received}, generated {generated}"
    assert charged == prompt + completion, f"the key was not charged what the gateway recorded: {facts}"
    assert completion >= received, f"under-billed: the client alone received more tokens: {facts}"
    assert completion <= 1.25 * generated + 2, f"over-billed: more than the engine generated: {facts}"
    assert charged < prompt + max_tokens / 2, f"charged the reservation, not what was generated: {facts}"


ABORT_AFTER = 5  # tokens the engine generates before it aborts
ABORTING = ["sglang", "lmdeploy", "vllm"]


@pytest.fixture(scope="module", params=ABORTING)
def aborting(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway in front of an emulator that aborts every generation after ABORT_AFTER tokens."""
    t = emulated(request.param, fault="engine_abort", fault_after_chunks=ABORT_AFTER)
    assert t.emulator is not None
    cfg = CONFIG.format(sha=digest_of(KEY), tpm=TPM, **t.config_fields)
    try:
        with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-abort"), startup_timeout=60) as gw:
            yield gw
    finally:
        t.emulator.__exit__(None, None, None)


def charged_and_recorded(gw: GatewayProcess, before: tuple[int, float, float, float]) -> tuple[int, float, float]:
    """(tokens charged to the key, prompt and completion tokens recorded) since `before`."""
    left0, requests0, prompt0, completion0 = before
    assert poll(lambda: recorded(gw)[0] > requests0, 30), "the gateway never recorded the aborted request"
    _, prompt1, completion1 = recorded(gw)
    return left0 - tokens_left(gw), prompt1 - prompt0, completion1 - completion0


def test_an_aborted_whole_answer_is_a_502_charged_the_engines_usage(aborting: GatewayProcess) -> None:
    before = (tokens_left(aborting), *recorded(aborting))
    body = {"model": "m", "messages": MSG, "max_tokens": 50}
    r = httpx.post(aborting.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 502 and r.json()["error"]["code"] == "generation_failed", r.text
    charged, prompt, completion = charged_and_recorded(aborting, before)
    assert completion == ABORT_AFTER, f"not the engine's count: recorded {completion}"
    assert prompt > 0 and charged == prompt + completion, f"charged {charged}, recorded {prompt} + {completion}"


def test_an_aborted_stream_ends_with_an_error_event_and_is_charged_its_text(aborting: GatewayProcess) -> None:
    before = (tokens_left(aborting), *recorded(aborting))
    body = {"model": "m", "messages": MSG, "max_tokens": 50, "stream": True}
    with (
        httpx.Client(timeout=60) as c,
        c.stream("POST", aborting.url + "/v1/chat/completions", json=body, headers=AUTH) as r,
    ):
        assert r.status_code == 200, r.read()
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"error"' in events[-2], events[-3:]
    chunks = [json.loads(e[6:]) for e in events[:-2]]
    assert all(ch["choices"][0].get("finish_reason") is None for ch in chunks), "the abort was passed on as a finish"
    relayed = sum(bool(ch["choices"][0]["delta"].get("content")) for ch in chunks)  # one token each
    assert 0 < relayed <= ABORT_AFTER + 1, events
    charged, prompt, completion = charged_and_recorded(aborting, before)
    # at least what it relayed, at most what the engine generated (the abort chunk carries one more token)
    # and the role chunk, which the estimate counts as an event
    assert relayed <= completion <= ABORT_AFTER + 2, f"not charged the relayed text: recorded {completion}"
    assert prompt > 0 and charged == prompt + completion, f"charged {charged}, recorded {prompt} + {completion}"
