"""tracing.AttemptTrace.inject: the W3C `traceparent` an attempt sends its engine is `00-<trace id>-<span id>-<flags>`
in lowercase hex, zero-padded (32 and 16 digits), whatever the ids' size; the access log's ids
(RequestTrace.ids) are the same text."""

from __future__ import annotations

import pytest

from llm_gateway.observability.tracing import AttemptTrace, RequestTrace


@pytest.mark.parametrize(
    ("trace_id", "span_id"), [(1, 1), (2**128 - 1, 2**64 - 1), (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF0)]
)
@pytest.mark.parametrize("sampled", [True, False])
def test_an_attempts_traceparent_is_the_w3c_text_of_its_ids(trace_id: int, span_id: int, sampled: bool) -> None:
    request = RequestTrace(None, trace_id.to_bytes(16, "big"), sampled)  # type: ignore[arg-type]
    attempt = AttemptTrace(request, None)
    attempt.span_id = span_id.to_bytes(8, "big")
    headers: dict[str, str] = {}
    attempt.inject(headers)
    assert headers == {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"}
    request.span_id = span_id.to_bytes(8, "big")
    assert request.ids == (f"{trace_id:032x}", f"{span_id:016x}")
