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

On a failure the message lists each one with schemathesis's own reproduction (a curl command).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import schemathesis
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.engine import Status, StopReason, events, from_schema

from llm_gateway.auth import digest_of
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


@dataclass
class Run:
    cases: Counter[str] = field(default_factory=Counter)  # per phase
    operations: set[str] = field(default_factory=set)  # tested
    documented: set[str] = field(default_factory=set)
    checks: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop_reason: StopReason | None = None
    seconds: float = 0.0
    slowest: tuple[float, str] = (0.0, "")

    @property
    def total(self) -> int:
        return sum(self.cases.values())


def run_schemathesis(base_url: str) -> Run:
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
        }
    )
    # every operation: schemathesis leaves out the one that served the document unless a filter names it
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", config=config, timeout=30).include(
        path_regex="^/"
    )
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
            for interaction in event.recorder.interactions.values():
                if interaction.response is not None and interaction.response.elapsed > run.slowest[0]:
                    request = interaction.request
                    run.slowest = (interaction.response.elapsed, f"{request.method} {request.uri[:100]}")
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    run.checks[check.name] += 1
                    if check.status == Status.SUCCESS:
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
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", embeddings=True)) as emu:
        cfg = f"""
server: {{access_log: false, max_body_bytes: 1048576, body_timeout_s: 5}}
auth:
  mode: keys
  keys: [{{name: schemathesis, sha256: "{digest_of(KEY)}"}}]
backends:
  - {{name: emu, engine: vllm, url: "{emu.url}", probe: {{interval_s: 1}}}}
models:
  - name: {MODEL}
    deployments: [{{backend: emu, model: tiny, format: safetensors, capabilities: [chat, completions, embeddings]}}]
"""
        with GatewayProcess(cfg, tmp_path_factory.mktemp("schemathesis")) as gw:
            yield gw


def test_the_gateway_answers_as_its_openapi_document_says(gateway: GatewayProcess) -> None:
    run = run_schemathesis(gateway.url)
    summary = (
        f"schemathesis {schemathesis.__version__}: {run.total} cases {dict(run.cases)} in {run.seconds:.1f}s, "
        f"slowest answer {run.slowest[0]:.2f}s ({run.slowest[1]}), checks run {dict(run.checks)}"
    )
    print(summary)
    assert not run.errors, "\n\n".join([summary, *run.errors])
    assert not run.failures, "\n\n".join([summary, f"{len(run.failures)} failures:", *run.failures])
    assert run.stop_reason == StopReason.COMPLETED, summary
    assert run.operations == run.documented, f"untested: {sorted(run.documented - run.operations)}"
    load_all_checks()
    assert set(run.checks) == set(CHECKS.get_all_names()), f"checks that never ran: {summary}"
    assert all(run.cases[phase] > 0 for phase in ("examples", "coverage", "fuzzing", "stateful")), summary
    assert run.total >= 500, summary
    assert gateway.proc is not None and gateway.proc.poll() is None, "the gateway died under schemathesis"
