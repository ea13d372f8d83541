"""Tracing's settings as the OpenTelemetry SDK reads them: the OTLP transport (config, else the
OTEL_EXPORTER_OTLP_* variables), the sampler (sampling_ratio, else OTEL_TRACES_SAMPLER(_ARG)) and the resource
(service_name, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). Read once, when tracing starts (tracing.py)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from llm_gateway.observability import otlp_senders
from llm_gateway.settings import TracingConfig

ID64 = 1 << 64  # trace ids' low 64 bits are under this; a ratio's bound is a share of it


def sender(cfg: TracingConfig) -> Any:
    """The OTLP transport: the config's protocol and endpoint, else the OTEL_* variables' (as the SDK reads them)."""
    env = os.environ.get
    proto = cfg.protocol or env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env("OTEL_EXPORTER_OTLP_PROTOCOL") or "http"
    timeout = float(env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env("OTEL_EXPORTER_OTLP_TIMEOUT") or 10)
    if proto == "grpc":
        endpoint = cfg.endpoint or env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env("OTEL_EXPORTER_OTLP_ENDPOINT")
        insecure = True if endpoint and endpoint.startswith("http:") else None
        return otlp_senders.GrpcSender(endpoint or "localhost:4317", timeout, insecure)
    endpoint = cfg.endpoint
    if endpoint is None:
        endpoint = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")  # the whole URL, as it is
        if endpoint is None:
            endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
            endpoint = endpoint.rstrip("/") + "/v1/traces"
    elif urlsplit(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # as the SDK does for OTEL_EXPORTER_OTLP_ENDPOINT
    return otlp_senders.HttpSender(endpoint, timeout)


def sampler(cfg: TracingConfig) -> tuple[bool, int]:
    """(parent-based, bound): a new trace is kept when its id's low 64 bits are under the bound, as the SDK's
    TraceIdRatioBased decides; parent-based follows a client's sampled flag. `sampling_ratio` is ParentBased(
    TraceIdRatioBased(ratio)); unset, OTEL_TRACES_SAMPLER(_ARG) (default parentbased_always_on)."""
    if cfg.sampling_ratio is not None:
        return True, round(cfg.sampling_ratio * ID64)
    name = (os.environ.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    parent_based = name.startswith("parentbased_")
    kind = name.removeprefix("parentbased_")
    if kind == "always_off":
        return parent_based, 0
    if kind == "traceidratio":
        try:
            ratio = min(1.0, max(0.0, float(os.environ.get("OTEL_TRACES_SAMPLER_ARG") or 1.0)))
        except ValueError:
            ratio = 1.0
        return parent_based, round(ratio * ID64)
    return parent_based, ID64  # always_on (and a sampler name not known here, as the SDK's default)


def resource(cfg: TracingConfig) -> dict[str, Any]:
    """service.name (config, OTEL_SERVICE_NAME, else llm-gateway) over OTEL_RESOURCE_ATTRIBUTES (k=v,... URL-encoded)
    and the telemetry.sdk.* the SDK's Resource.create adds."""
    attrs: dict[str, Any] = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "llm-gateway"}
    for item in (os.environ.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip():
            attrs[unquote(k.strip())] = unquote(v.strip())
    name = cfg.service_name or os.environ.get("OTEL_SERVICE_NAME") or attrs.get("service.name") or "llm-gateway"
    attrs["service.name"] = name
    return attrs
