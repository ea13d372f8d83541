"""Secrets at rest and in logs (red-team L7, L8): the SQLite file that holds every stored prompt is the
gateway's owner's alone (0600, its WAL and shared-memory files too, in a 0700 directory when the gateway
creates it), and a database password never reaches a log line or a shown URL, wherever the URL carries it
(userinfo, or query parameters like `password` and `sslpassword`)."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_gateway.cli import main
from llm_gateway.settings.loader import ConfigError, parse_config
from llm_gateway.state.database import DB_FILE, Database, database_url, redacted_url
from llm_gateway.state.usage import UsageStore
from tests.support.postgres_server import PostgresServer, running_postgres


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def usual_umask() -> Iterator[None]:
    """The umask of a bare-metal install (022): what made the red team's files 0644 and 0755."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def sqlite_config(data_dir: Path) -> str:
    return f"""
server: {{data_dir: "{data_dir}"}}
auth: {{mode: none}}
backends: [{{name: e, engine: vllm, url: "http://127.0.0.1:9"}}]
models: [{{name: m, deployments: [{{backend: e, model: m, format: safetensors}}]}}]
"""


async def test_the_sqlite_file_its_wal_and_shm_are_0600_in_a_0700_directory(tmp_path: Path, usual_umask: None):
    data_dir = tmp_path / "rt-data"  # the red team's layout: the gateway creates the directory
    cfg = parse_config(sqlite_config(data_dir), "t.yaml", {})
    db = await Database.from_config(cfg)
    try:
        await UsageStore(db).insert(
            [
                {
                    "at_ms": 1,
                    "day": "1970-01-01",
                    "request_id": "r",
                    "key": "k",
                    "model": "m",
                    "backend": "e",
                    "endpoint": "chat",
                    "status": 200,
                    "outcome": "success",
                    "prompt_tokens": 1,
                    "completion_tokens": 1,
                    "usage_estimated": False,
                    "ttft_ms": None,
                    "duration_ms": 1.0,
                }
            ]
        )
        files = {p.name: mode(p) for p in data_dir.iterdir()}
        assert {DB_FILE, f"{DB_FILE}-wal", f"{DB_FILE}-shm"} <= set(files), files  # WAL mode, a connection open
        assert files == dict.fromkeys(files, 0o600), files
        assert mode(data_dir) == 0o700
    finally:
        await db.aclose()
    assert database_url(cfg).endswith(str(data_dir.resolve() / DB_FILE))


async def test_an_existing_directory_keeps_its_mode_and_the_file_is_still_0600(tmp_path: Path, usual_umask: None):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o750)  # the container image's /data: the operator's choice, left as it is
    os.chmod(data_dir, 0o750)
    db = await Database.open(f"sqlite+aiosqlite:///{data_dir / DB_FILE}")
    await db.aclose()
    assert mode(data_dir) == 0o750
    assert mode(data_dir / DB_FILE) == 0o600


# -- database URLs in logs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql+asyncpg://u@h/db?password=s3cret", "s3cret"),
        ("postgresql+asyncpg://u:s3cret@h:5432/db", "s3cret"),
        ("postgresql+asyncpg://u@h/db?sslmode=require&sslpassword=s3cret", "s3cret"),
        ("postgresql+asyncpg://u@h/db?PassWord=s3cret&password=other", "other"),
        ("postgresql+asyncpg://u:p%40ss@h/db?password=s3cret%26x", "s3cret"),
    ],
)
def test_redacted_url_hides_every_password(url: str, secret: str):
    shown = redacted_url(url)
    assert secret not in shown and "***" in shown
    assert shown.startswith("postgresql+asyncpg://u") and "@h" in shown  # still says where it points


def test_redacted_url_keeps_what_is_not_secret():
    assert redacted_url("postgresql+asyncpg://u@h/db?sslmode=require") == "postgresql+asyncpg://u@h/db?sslmode=require"
    assert (
        redacted_url("sqlite+aiosqlite:////var/lib/gw/llm-gateway.db")
        == "sqlite+aiosqlite:////var/lib/gw/llm-gateway.db"
    )
    assert redacted_url("not a url ::") == "(a database URL that cannot be parsed)"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


async def test_a_postgres_password_in_the_query_string_is_never_logged(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
):
    """The red team's L8: `?password=` was logged in clear when the database opened."""
    url = postgres.new_database()  # postgresql+asyncpg://gw:<password>@127.0.0.1:<port>/<db>
    head, _, rest = url.partition("://")
    userinfo, _, where = rest.partition("@")
    user = userinfo.split(":", 1)[0]
    in_query = f"{head}://{user}@{where}?password={postgres.password}"
    caplog.set_level(logging.DEBUG)
    db = await Database.open(in_query)  # password auth: it only opens with the password from the query
    try:
        assert "database ready" in caplog.text  # the URL was logged: the check below is not vacuous
        assert postgres.password not in caplog.text
        assert postgres.password not in repr(db) and postgres.password not in db.safe_url
        assert where.split("/")[0] in db.safe_url
    finally:
        await db.aclose()


def test_check_config_shows_no_database_redis_or_engine_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "gw.yaml"
    path.write_text(
        sqlite_config(tmp_path / "data")
        + """
database: {url: "postgresql+asyncpg://u:dbpass1@db.internal/gw?sslpassword=dbpass2"}
limits: {store: redis, redis_url: "redis://:redispass3@redis.internal:6379/0?password=redispass4"}
"""
    )
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr()
    for secret in ("dbpass1", "dbpass2", "redispass3", "redispass4"):
        assert secret not in out.out + out.err


def test_a_backend_url_with_credentials_is_refused_without_echoing_them():
    text = sqlite_config(Path("/tmp/unused")).replace("http://127.0.0.1:9", "http://admin:engpass5@127.0.0.1:9")
    with pytest.raises(ConfigError) as e:
        parse_config(text, "t.yaml", {})
    assert "must not carry credentials" in str(e.value) and "engpass5" not in str(e.value)
