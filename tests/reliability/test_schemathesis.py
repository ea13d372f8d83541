"""An outside tester: schemathesis reads the gateway's own /openapi.json from a live gateway process
(in front of a vLLM emulator, with a real API key) and holds every operation to it with every check
it has, through all of its phases: schema examples, coverage (boundary values, unexpected methods,
missing auth and headers), fuzzing (valid and invalid data) and stateful runs along the document's
links. A request valid by the document must not be refused, an invalid one must be, no answer may
be a 5xx, and every answer must match the document (status, content type, body, headers).

Run through schemathesis's Python engine, the one its CLI drives: its pytest integration
(`schemathesis.pytest.from_fixture`) does not work with the pinned pytest (it sets `Node._nodeid`,
which pytest 9 no longer has). Bounded and reproducible: a fixed seed, deterministic generation, no
example database, no schemathesis cache, one worker, 50 fuzzed examples per operation; schemathesis sets no Hypothesis
deadline, so a slow machine is slow, never failing. `max_response_time` is the one check left off:
it needs a time limit, which would be a flaky verdict on a loaded machine.

The Responses API's stored responses are real in this run: the gateway keeps them in an SQLite file
under a temporary `server.data_dir`, and before schemathesis starts the test creates some through
the engine (whole, streamed, chained; each answer held to the document), checks that they can be
read, listed and deleted, and hands their ids to schemathesis as a dictionary for the
`response_id` path parameter (half of the generated ids; DELETE draws from ids of its own, so the
GETs keep finding theirs). Everything else schemathesis sends stays off the engine (see MODEL).

On a failure the message lists each one with schemathesis's own reproduction (a curl command).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import orjson
import pytest
import schemathesis
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.engine import Status, StopReason, events, from_schema
from schemathesis.schemas import BaseSchema

from llm_gateway.access.keys import digest_of
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess

KEY = "sk-schemathesis-0123456789"
SEED = 20260601
# A name no example in the document uses, so that generated requests stop at the model lookup (404)
# rather than reach the engine: the engine's own limits (vLLM's temperature >= 0, its context length,
# n > 1 only when sampling) and the deployment's weight formats and capabilities are configuration,
# not something the gateway's document can state. GET /v1/models and the stateful link to
# GET /v1/models/{model} do use it. (tests/reliability/test_fuzz.py sends requests to the engine.)
MODEL = "st-model"
MAX_EXAMPLES = 50  # per operation, in the fuzzing phase (coverage and stateful add their own)
# the operations on a stored response, and the answers they must give schemathesis at least once
# (the dictionary ids make the 200s; generated ids the 404s)
#: schemathesis's default answers to a valid request, and the 400 for a `previous_response_id` of no response
ACCEPTED = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]
STORED_OPERATIONS = {
    "GET /v1/responses/{response_id}": (200, 404),
    "GET /v1/responses/{response_id}/input_items": (200, 404),
    "DELETE /v1/responses/{response_id}": (200, 404),
}


# operations whose 400s depend on content no schema states: an upload must be non-blank UTF-8 JSONL, and a
# batch's completion window has a configured maximum and its file's lines are checked when it is created
CONTENT_CHECKED = ("POST /v1/files", "POST /v1/batches")


# Gateway bugs schemathesis finds outside this test's reach, each (operation, check) with its cause.
# Strict: a failure of another kind fails the test, and so does a known one that no longer happens
# (the bug was fixed: take it out of here).
KNOWN_GATEWAY_BUGS: dict[tuple[str, str], str] = {}  # (operation, check) -> why: none known


@dataclass
class Stored:
    """Responses stored before the run: `kept` for the GETs, `disposable` for DELETE."""

    kept: list[str]
    disposable: list[str]


@dataclass
class Run:
    cases: Counter[str] = field(default_factory=Counter)  # per phase
    operations: set[str] = field(default_factory=set)  # tested
    documented: set[str] = field(default_factory=set)
    checks: Counter[str] = field(default_factory=Counter)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)  # (operation, status)
    failures: list[str] = field(default_factory=list)
    known: Counter[tuple[str, str]] = field(default_factory=Counter)  # KNOWN_GATEWAY_BUGS seen
    errors: list[str] = field(default_factory=list)
    stop_reason: StopReason | None = None
    seconds: float = 0.0
    slowest: tuple[float, str] = (0.0, "")

    @property
    def total(self) -> int:
        return sum(self.cases.values())


def load_schema(base_url: str, stored: Stored | None = None) -> BaseSchema:
    ids: dict[str, object] = {}
    if stored is not None:
        ids = {
            # schemathesis's dictionaries: real ids for `response_id`, half of the time
            "dictionaries": {"kept": {"values": stored.kept}, "disposable": {"values": stored.disposable}},
            "parameters": {"path.response_id": {"dictionary": "kept", "probability": 0.5}},
            "operations": [
                # with an `[[operations]]` list, only a filter in it selects the operation that served the
                # document (the `include()` below no longer does): this entry names it
                {"include-path": "/openapi.json", "enabled": True},
                # by name: a method and a path filter in one entry would select the GETs too
                {
                    "include-name": "DELETE /v1/responses/{response_id}",
                    "parameters": {"path.response_id": {"dictionary": "disposable", "probability": 0.5}},
                },
                # a well-formed `previous_response_id` that names no stored response is OpenAI's 400
                # `previous_response_not_found` (what Codex recovers on), which no schema can state
                *(
                    {"include-name": name, "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}}}
                    for name in ("POST /v1/responses", "POST /v1/responses/input_tokens", *CONTENT_CHECKED)
                ),
            ],
        }
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "workers": 1,
            # no crash cache in .schemathesis/: a run must not depend on what earlier runs found
            "cache": {"enabled": False},
            "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
            "checks": {"enabled": True},
            # the two schemes the document declares, both with the test key
            "auth": {"openapi": {"bearer": {"bearer": KEY}, "apiKey": {"api_key": KEY}}},
            "request-timeout": 30,
            **ids,
        }
    )
    # every operation: schemathesis leaves out the one that served the document unless a filter names it
    return schemathesis.openapi.from_url(base_url + "/openapi.json", config=config, timeout=30).include(path_regex="^/")


def run_schemathesis(base_url: str, stored: Stored) -> Run:
    schema = load_schema(base_url, stored)
    run = Run()
    run.documented = {
        f"{method.upper()} {path}"
        for path, item in schema.raw_schema["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "options", "head", "patch", "trace")
    }
    t0 = time.monotonic()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            run.cases[event.phase.value] += len(event.recorder.cases)
            for node in event.recorder.cases.values():
                run.operations.add(node.value.operation.label)
            for case_id, interaction in event.recorder.interactions.items():
                if interaction.response is None:
                    continue
                case = event.recorder.cases.get(case_id)
                if case is not None:
                    run.statuses[case.value.operation.label, interaction.response.status_code] += 1
                if interaction.response.elapsed > run.slowest[0]:
                    request = interaction.request
                    run.slowest = (interaction.response.elapsed, f"{request.method} {request.uri[:100]}")
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    run.checks[check.name] += 1
                    if check.status == Status.SUCCESS:
                        continue
                    if (event.recorder.label, check.name) in KNOWN_GATEWAY_BUGS:
                        run.known[event.recorder.label, check.name] += 1
                        continue
                    info = check.failure_info
                    detail = f"{info.failure.title}: {info.failure.message}\n{info.code_sample}" if info else ""
                    run.failures.append(
                        f"[{event.phase.value}] {event.recorder.label} {check.name} {case_id}\n{detail}"
                    )
        elif isinstance(event, events.NonFatalError):
            run.errors.append(f"[{event.phase}] {event.label}: {event.info.format()}")
        elif isinstance(event, events.FatalError):
            run.errors.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.EngineFinished):
            run.stop_reason = event.stop_reason
            run.failures.extend(f"[after run] {f.title}: {f.message}" for f in event.failures)
    run.seconds = time.monotonic() - t0
    return run


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # reasoning tokens: the stored responses carry a reasoning item too
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", embeddings=True, reasoning_tokens=2)) as emu:
        work = tmp_path_factory.mktemp("schemathesis")
        cfg = f"""
server: {{access_log: false, max_body_bytes: 1048576, body_timeout_s: 5, data_dir: "{work / "data"}"}}
auth:
  mode: keys
  keys: [{{name: schemathesis, sha256: "{digest_of(KEY)}"}}]
backends:
  - {{name: emu, engine: vllm, url: "{emu.url}", probe: {{interval_s: 1}}}}
models:
  - name: {MODEL}
    deployments: [{{backend: emu, model: tiny, format: safetensors, capabilities: [chat, completions, embeddings]}}]
"""
        with GatewayProcess(cfg, work) as gw:
            yield gw


def _last_event(stream: httpx.Response) -> dict[str, object]:
    data = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
    event: dict[str, object] = orjson.loads(data[-1])
    return event


@pytest.fixture(scope="module")
def stored(gateway: GatewayProcess) -> Stored:
    """Responses created through the engine, each answer held to the document, then read, listed, deleted."""
    schema = load_schema(gateway.url)
    create = schema["/v1/responses"]["POST"]
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as c:

        def make(body: dict[str, object]) -> str:
            r = c.post("/v1/responses", json={"model": MODEL, **body})
            assert r.status_code == 200, r.text
            assert "x-gateway-stored" not in r.headers, "the response was not stored"
            create.validate_response(r)
            if body.get("stream"):
                last = _last_event(r)
                assert last["type"] == "response.completed", last
                resp = last["response"]
                assert isinstance(resp, dict)
                return str(resp["id"])
            return str(r.json()["id"])

        first = make({"input": "Hello", "instructions": "Be brief.", "metadata": {"run": "schemathesis"}})
        items = [
            {"role": "user", "content": [{"type": "input_text", "text": "What is the weather?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ]
        chained = make({"input": items, "previous_response_id": first, "stream": True})
        disposable = [make({"input": f"Number {i}", "stream": i % 2 == 1}) for i in range(3)]

        got = c.get(f"/v1/responses/{first}")
        assert got.status_code == 200 and got.json()["id"] == first, got.text
        schema["/v1/responses/{response_id}"]["GET"].validate_response(got)
        page = c.get(f"/v1/responses/{chained}/input_items", params={"order": "asc"})
        assert page.status_code == 200, page.text
        schema["/v1/responses/{response_id}/input_items"]["GET"].validate_response(page)
        assert [it["type"] for it in page.json()["data"]] == ["message", "function_call", "function_call_output"]
        gone = make({"input": "Delete me"})
        deleted = c.delete(f"/v1/responses/{gone}")
        assert deleted.status_code == 200, deleted.text
        schema["/v1/responses/{response_id}"]["DELETE"].validate_response(deleted)
        assert c.get(f"/v1/responses/{gone}").status_code == 404
    return Stored(kept=[first, chained], disposable=disposable)


def test_the_gateway_answers_as_its_openapi_document_says(gateway: GatewayProcess, stored: Stored) -> None:
    run = run_schemathesis(gateway.url, stored)
    summary = (
        f"schemathesis {schemathesis.__version__}: {run.total} cases {dict(run.cases)} in {run.seconds:.1f}s, "
        f"slowest answer {run.slowest[0]:.2f}s ({run.slowest[1]}), checks run {dict(run.checks)}"
    )
    print(summary)
    assert not run.errors, "\n\n".join([summary, *run.errors])
    assert not run.failures, "\n\n".join([summary, f"{len(run.failures)} failures:", *run.failures])
    for bug, cause in KNOWN_GATEWAY_BUGS.items():
        print(f"known gateway bug, {run.known[bug]} failures of {bug}: {cause}")
        assert run.known[bug] > 0, f"{bug} no longer fails: remove it from KNOWN_GATEWAY_BUGS"
    assert run.stop_reason == StopReason.COMPLETED, summary
    assert run.operations == run.documented, f"untested: {sorted(run.documented - run.operations)}"
    load_all_checks()
    assert set(run.checks) == set(CHECKS.get_all_names()), f"checks that never ran: {summary}"
    assert all(run.cases[phase] > 0 for phase in ("examples", "coverage", "fuzzing", "stateful")), summary
    assert run.total >= 500, summary
    for operation, statuses in STORED_OPERATIONS.items():
        print(operation, {code: n for (op, code), n in sorted(run.statuses.items()) if op == operation})
        for status in statuses:
            assert run.statuses[operation, status] > 0, f"{operation} never answered {status}: {summary}"
    assert gateway.proc is not None and gateway.proc.poll() is None, "the gateway died under schemathesis"
