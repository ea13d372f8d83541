"""The gateway process's own sections: the HTTP server (ports, limits on requests, timeouts, CORS,
logging, the upstream client), the usage ledger and the database.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from llm_gateway.settings.vocabulary import PriorityClass, Strict


class CorsConfig(Strict):
    """CORS for browser clients; off (no CORS headers at all) while `allow_origins` is empty."""

    allow_origins: tuple[str, ...] = Field((), description='origins allowed, e.g. "https://app.example.com"; "*": any')
    allow_headers: tuple[str, ...] = (
        "authorization",
        "content-type",
        "x-api-key",
        "x-request-id",
        "anthropic-version",
        "anthropic-beta",
        "x-session-id",
        "x-gateway-format",
    )
    max_age_s: int = Field(600, ge=0, description="how long a browser may cache a preflight answer")

    @field_validator("allow_origins")
    @classmethod
    def _check_origins(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for origin in v:
            origin = origin.rstrip("/").lower()
            if origin != "*":
                parts = urlsplit(origin)
                if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
                    raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path) or '*'")
            out.append(origin)
        return tuple(out)

    @field_validator("allow_headers")
    @classmethod
    def _lower(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(h.lower() for h in v)


class MetricsAuthConfig(Strict):
    """A bearer token for /metrics on the main port: with it, the main port serves every series (those
    labelled by key too) to a caller that presents it, and 401 to anyone else."""

    sha256: str = Field(description="hex SHA-256 digest of the metrics token; the token itself is never stored")

    @field_validator("sha256")
    @classmethod
    def _check_digest(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("must be 64 hex characters (sha256 of the metrics token)")
        return v.lower()


class ServerConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    metrics_port: int | None = Field(None, ge=0, le=65535, description="also serve /metrics on this port")
    metrics_on_main_port: bool = True
    metrics_auth: MetricsAuthConfig | None = Field(
        None,
        description="unset: /metrics on the main port answers anyone but leaves out the series labelled by key "
        "(tenant names and usage; metrics_port has them all); set: it needs this bearer token and has every series",
    )
    admin_port: int | None = Field(
        None, ge=0, le=65535, description="serve the admin API (/admin) on this port alone, not on the main port"
    )
    cors: CorsConfig = CorsConfig()
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_audio_bytes: int = Field(
        25 * 1024 * 1024, ge=1024, description="largest multipart form /v1/audio/* takes (OpenAI's 25 MB); past it 413"
    )
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    header_timeout_s: float = Field(15.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    keepalive_timeout_s: float = Field(30.0, gt=0)
    max_connections: int = Field(16384, ge=1)
    max_unauthenticated_connections: int | None = Field(
        None,
        ge=1,
        description="connections that have not yet shown a key (client or admin) may hold at most this many of "
        "max_connections; past it the oldest of them is dropped. Unset: max_connections / 2",
    )
    graceful_shutdown_s: float = Field(30.0, ge=0)
    access_log: bool = True
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    upstream_client: Literal["h1", "aiohttp", "httpx"] = Field(
        "h1", description="the HTTP client to engines: the gateway's own HTTP/1.1 client, or aiohttp or httpx"
    )
    reasoning_field: Literal["reasoning_content", "reasoning"] = Field(
        "reasoning_content", description="the one name reasoning text gets in answers, whatever the engine calls it"
    )
    reload_poll_s: float = Field(2.0, ge=0, description="config file check interval; 0 turns watching off")
    data_dir: str = Field("data", description="where the embedded database lives (relative: to the working directory)")

    @model_validator(mode="after")
    def _unauthenticated_below_the_cap(self) -> ServerConfig:
        n = self.max_unauthenticated_connections
        if n is not None and n >= self.max_connections:
            raise ValueError(
                f"max_unauthenticated_connections ({n}) must be below max_connections ({self.max_connections}): "
                "the rest is what keyed clients always find free"
            )
        return self

    @property
    def unauthenticated_connections(self) -> int:
        """The cap on connections that have not shown a key (`max_unauthenticated_connections`, or its default)."""
        if self.max_unauthenticated_connections is not None:
            return self.max_unauthenticated_connections
        return max(1, self.max_connections // 2)


class UsageConfig(Strict):
    """The usage ledger: one row per generation request in the database, written in batches behind the
    request path (a bounded buffer; past it rows are counted as dropped)."""

    ledger: bool = Field(False, description="keep the ledger in the database (database.url or server.data_dir)")
    buffer_rows: int = Field(10_000, ge=1, description="rows held while the database is slow or down")
    batch_rows: int = Field(500, ge=1, description="rows per INSERT")
    flush_interval_s: float = Field(1.0, gt=0)
    spool: bool = Field(
        True,
        description="copy unwritten rows and requests in flight to <server.data_dir>/ledger-spool at each flush, "
        "replayed at the next start after a crash",
    )


class TracingConfig(Strict):
    """OpenTelemetry traces (observability/tracing.py): one span per request and per attempt, exported over OTLP
    in batches. Off: the request path makes no span object and imports no OpenTelemetry package (the `tracing`
    extra). What is unset here is the SDK's, from the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_TRACES_SAMPLER(_ARG), OTEL_BSP_*, OTEL_SERVICE_NAME, ...)."""

    enabled: bool = Field(
        False, description="export traces (needs the tracing extra: pip install llm-gateway[tracing])"
    )
    endpoint: str | None = Field(
        None,
        description="the OTLP receiver: http://host:4318 (HTTP; /v1/traces is added to a bare host) or "
        "http://host:4317 (gRPC); unset: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else the SDK's default",
    )
    protocol: Literal["http", "grpc"] | None = Field(
        None, description="OTLP over HTTP (protobuf) or gRPC; unset: OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, else http"
    )
    sampling_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="share of new traces kept (a client's sampled flag is followed); unset: OTEL_TRACES_SAMPLER, "
        "else all",
    )
    capture_content: bool = Field(
        False, description="put prompts and whole answers' text on the spans (gen_ai.input/output.messages)"
    )
    service_name: str | None = Field(
        None, description="the traces' service.name; unset: OTEL_SERVICE_NAME, else llm-gateway"
    )


DATABASE_SCHEMES = ("postgresql+asyncpg", "sqlite+aiosqlite")
DB_FILE = "llm-gateway.db"  # the embedded database's file, under server.data_dir


class DatabaseConfig(Strict):
    url: SecretStr | None = Field(
        None,
        description="postgresql+asyncpg://user:password@host:5432/db for a database the replicas share; "
        "unset: the embedded SQLite file in server.data_dir",
    )
    pool_size: int = Field(5, ge=1, le=100, description="connections each replica keeps to a shared database")
    connect_timeout_s: float = Field(5.0, gt=0, description="to connect; past it the database is unavailable (503)")
    statement_timeout_s: float = Field(
        10.0, gt=0, description="per statement, lock waits included, before it is cancelled (SQLite: the busy timeout)"
    )

    @field_validator("url", mode="before")
    @classmethod
    def _empty_url_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("url")
    @classmethod
    def _check_scheme(cls, v: SecretStr | None) -> SecretStr | None:
        # the message never echoes the value: it is a secret (and without "://" it could be all password)
        if v is not None and v.get_secret_value().partition("://")[0] not in DATABASE_SCHEMES:
            raise ValueError("must start with postgresql+asyncpg:// (a shared Postgres) or sqlite+aiosqlite://")
        return v


class BatchesConfig(Strict):
    """OpenAI's Batch API (`/v1/files`, `/v1/batches`): files and batch state in the gateway's database, each
    line run through the same request path as live traffic by a runner in every replica."""

    enabled: bool = Field(True, description="serve /v1/files and /v1/batches and run batches")
    max_file_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="largest JSONL a client may upload")
    max_lines: int = Field(50_000, ge=1, description="most requests one batch may hold")
    concurrency: int = Field(8, ge=1, description="lines of one batch in flight at once, across replicas")
    priority: PriorityClass = Field(
        "batch", description="the queue class batch lines run in (a key's own class can only lower it)"
    )
    max_attempts: int = Field(
        5, ge=1, description="a line refused for a passing reason (429, 5xx) is retried up to this many times"
    )
    retry_after_s: float = Field(5.0, gt=0, description="how long such a line waits before it is tried again")
    lease_s: float = Field(
        60.0, gt=0, description="a claimed line's lease; renewed while it runs, redone by any replica once it lapses"
    )
    poll_s: float = Field(1.0, gt=0, description="how often the runner looks for work it was not told about")
    max_window_s: float = Field(7 * 86400.0, gt=0, description="the longest completion_window a batch may ask")
