"""The error tree: what each class means, what it answers with, and how dispatch judges it.

Callers branch on classes, never on message text: the tree's subclass relations, `retryable` per
class, the envelope fields clients read, and `attempt.judge` marking a backend down on
`ConnectFailed` (whatever its message says) and only then.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from llm_gateway import errors
from llm_gateway.errors import (
    DONE,
    AdapterLoadFailed,
    AuthenticationFailed,
    BackendFailure,
    ConnectFailed,
    EngineErrorAnswer,
    GatewayError,
    InvalidJSON,
    InvalidRequest,
    ModelNotFound,
    NoHealthyBackend,
    Overloaded,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
    StreamInterrupted,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from llm_gateway.routing.attempt import judge

FAILURES = (
    UpstreamUnreachable,
    ConnectFailed,
    UpstreamTimeout,
    UpstreamProtocolError,
    StreamInterrupted,
    AdapterLoadFailed,
)


# -- the tree ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "parent"),
    [
        (UpstreamError, GatewayError),
        (EngineErrorAnswer, UpstreamError),
        (BackendFailure, UpstreamError),
        (UpstreamUnreachable, BackendFailure),
        (ConnectFailed, UpstreamUnreachable),
        (UpstreamTimeout, BackendFailure),
        (UpstreamProtocolError, BackendFailure),
        (StreamInterrupted, BackendFailure),
        (InvalidJSON, InvalidRequest),
    ],
)
def test_each_class_sits_under_its_parent(cls: type, parent: type):
    assert cls.__mro__[1] is parent


def test_an_engine_answer_is_not_a_backend_failure_and_back():
    assert not issubclass(EngineErrorAnswer, BackendFailure)
    assert not issubclass(BackendFailure, EngineErrorAnswer)


@pytest.mark.parametrize(
    "cls",
    [
        InvalidRequest,
        AuthenticationFailed,
        PermissionDenied,
        ModelNotFound,
        RateLimited,
        Overloaded,
        NoHealthyBackend,
        ServiceUnavailable,
    ],
)
def test_client_and_gateway_side_errors_are_not_upstream_errors(cls: type[GatewayError]):
    assert not issubclass(cls, UpstreamError)


def test_every_upstream_error_class_is_in_the_tree():
    found = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, UpstreamError)}
    assert found == {UpstreamError, EngineErrorAnswer, BackendFailure, *FAILURES}


# -- retryable ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [BackendFailure, *FAILURES])
def test_a_backend_failure_is_retryable_as_a_class_attribute(cls: type[BackendFailure]):
    assert cls.retryable is True  # on the class: no instance needed
    assert cls("x").retryable is True


def test_retryable_is_a_plain_class_attribute_not_a_property():
    assert not any(isinstance(vars(c).get("retryable"), property) for c in GatewayError.__mro__)
    assert vars(BackendFailure)["retryable"] is True
    assert vars(GatewayError)["retryable"] is False


@pytest.mark.parametrize("cls", [InvalidRequest, RateLimited, Overloaded, NoHealthyBackend, ServiceUnavailable])
def test_other_errors_are_not_retryable(cls: type[GatewayError]):
    assert cls("x").retryable is False


def test_an_engine_answer_is_retryable_only_when_the_adapter_says_so():
    assert EngineErrorAnswer("x").retryable is False
    assert EngineErrorAnswer("x", retryable=True).retryable is True
    e = EngineErrorAnswer("full", status=503, busy=True, retryable=True)
    assert (e.status, e.busy, e.retryable) == (503, True, True)
    assert EngineErrorAnswer("x").busy is False


# -- what clients read -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "status", "code"),
    [
        (UpstreamUnreachable, 502, "upstream_unreachable"),
        (ConnectFailed, 502, "upstream_unreachable"),
        (UpstreamTimeout, 504, "upstream_timeout"),
        (UpstreamProtocolError, 502, "upstream_bad_response"),
        (StreamInterrupted, 502, "stream_interrupted"),
    ],
)
def test_backend_failures_keep_their_status_type_and_code(cls: type[GatewayError], status: int, code: str):
    e = cls("m")
    assert (e.status, e.type, e.code) == (status, "upstream_error", code)
    assert e.envelope() == {"error": {"message": "m", "type": "upstream_error", "param": None, "code": code}}


def test_an_engine_answer_takes_its_fields_from_the_adapter():
    e = EngineErrorAnswer("bad", status=400, type_="invalid_request_error", code="c", param="p", backend="b")
    assert (e.status, e.type, e.code, e.param, e.backend) == (400, "invalid_request_error", "c", "p", "b")
    assert (EngineErrorAnswer("x").status, EngineErrorAnswer("x").type) == (500, "upstream_error")


def test_done_follows_an_error_event():
    assert DONE == b"data: [DONE]\n\n"
    assert StreamInterrupted("cut").sse_event() == (
        b'data: {"error":{"message":"cut","type":"upstream_error","param":null,"code":"stream_interrupted"}}\n\n'
    )


# -- attempt.judge --------------------------------------------------------------------------------------
class Breaker:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def neutral(self) -> None:
        self.calls.append("neutral")

    def failure(self, now: float) -> None:
        self.calls.append("failure")

    def success(self) -> None:
        self.calls.append("success")


def deployment() -> SimpleNamespace:
    return SimpleNamespace(backend=SimpleNamespace(state="ready", detail="", busy_until=0.0), breaker=Breaker())


def judged(err: GatewayError) -> SimpleNamespace:
    dep = deployment()
    judge(dep, err, 100.0)  # type: ignore[arg-type]
    return dep


@pytest.mark.parametrize("message", ["cannot connect to the engine: refused", "connection refused", "no route"])
def test_connect_failed_marks_the_backend_down_whatever_its_message(message: str):
    dep = judged(ConnectFailed(message))
    assert (dep.backend.state, dep.backend.detail, dep.breaker.calls) == ("down", message, ["failure"])


@pytest.mark.parametrize(
    "err",
    [
        UpstreamUnreachable("cannot connect to the engine: the message alone does not make it down"),
        UpstreamUnreachable("the engine closed the connection without answering"),
        UpstreamTimeout("slow"),
        UpstreamProtocolError("html"),
        StreamInterrupted("cut"),
    ],
)
def test_other_backend_failures_open_the_breaker_but_leave_the_backend_up(err: GatewayError):
    dep = judged(err)
    assert (dep.backend.state, dep.breaker.calls) == ("ready", ["failure"])


def test_a_busy_engine_is_neutral_for_the_breaker_and_skipped_for_a_second():
    dep = judged(EngineErrorAnswer("queue full", status=503, busy=True, retryable=True))
    assert (dep.breaker.calls, dep.backend.busy_until, dep.backend.state) == (["neutral"], 101.0, "ready")


@pytest.mark.parametrize("code", ["upstream_model_not_found", "upstream_not_supported"])
def test_an_endpoint_mismatch_is_neutral(code: str):
    assert judged(EngineErrorAnswer("no such model", status=502, code=code)).breaker.calls == ["neutral"]


def test_an_engine_5xx_answer_is_a_failure_and_a_4xx_answer_a_success():
    assert judged(EngineErrorAnswer("boom", status=500)).breaker.calls == ["failure"]
    assert judged(EngineErrorAnswer("bad request", status=400)).breaker.calls == ["success"]
    assert judged(InvalidRequest("bad")).breaker.calls == ["success"]


def test_the_drawn_tree_names_every_error_class_under_its_parent() -> None:
    """The tree in errors.py's docstring is the plan callers read: every GatewayError class of the product is
    in it, and a class drawn under another (├── / └── one level deeper) is its subclass."""
    import importlib
    import pkgutil
    import re

    import llm_gateway

    for info in pkgutil.walk_packages(llm_gateway.__path__, "llm_gateway."):
        if not info.name.endswith("__main__") and ".migrations" not in info.name:
            importlib.import_module(info.name)

    def every(cls: type) -> set[type]:
        return {cls}.union(*(every(c) for c in cls.__subclasses__()))

    doc = errors.__doc__ or ""
    block = [ln for ln in doc.splitlines() if re.match(r"    \s*(GatewayError|[│├└])", ln)]
    drawn = {n for ln in block for n in re.findall(r"\b([A-Z][A-Za-z]+)\b", ln)}
    classes = {c.__name__: c for c in every(GatewayError)}
    missing = sorted(n for n in classes if n not in drawn and not n.startswith("_"))
    assert not missing, f"error classes not drawn in errors.py's tree: {missing}"
    lines = [ln for ln in block if re.search(r"[├└]── ", ln)]
    stack: list[tuple[int, list[str]]] = []
    for ln in lines:
        depth = ln.index("── ") // 4
        names = [n for n in re.findall(r"\b([A-Z][A-Za-z]+)\b", ln.split("── ", 1)[1]) if n in classes]
        stack = [s for s in stack if s[0] < depth]
        if stack and names:
            parents = stack[-1][1]
            for n in names:
                assert any(issubclass(classes[n], classes[p]) for p in parents), f"{n} is drawn under {parents}"
        if names:
            stack.append((depth, names[:1]))
