"""The `llm-gateway` command: serve, check-config, keys. Argument handling only; no logic.

llm-gateway serve [--config PATH] [--host H] [--port P]
llm-gateway check-config PATH
llm-gateway keys new NAME --models GLOB [GLOB ...] [--rpm N] [--tpm N] [--concurrency N]
llm-gateway keys digest            (reads a key on stdin, prints its SHA-256)
llm-gateway usage [--config PATH] [--since 7d] [--until T] [--by key,model] [--format table|csv|json]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import yaml

from llm_gateway.access.keys import digest_of, new_key
from llm_gateway.settings import GatewayConfig
from llm_gateway.settings.loader import DEFAULT_CONFIG, ConfigError, load_config

if TYPE_CHECKING:
    from llm_gateway.state.usage import UsageRow


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llm-gateway", description="One OpenAI-compatible endpoint for local LLM engines.")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", default=os.environ.get("GATEWAY_CONFIG", DEFAULT_CONFIG))
    s.add_argument("--host")
    s.add_argument("--port", type=int)

    c = sub.add_parser("check-config", help="validate a config file and print the routing table")
    c.add_argument("path")

    k = sub.add_parser("keys", help="API keys")
    ks = k.add_subparsers(dest="keys_cmd", required=True)
    kn = ks.add_parser("new", help="make a key; prints it once, with the config entry holding its digest")
    kn.add_argument("name")
    kn.add_argument(
        "--models",
        nargs="+",
        required=True,
        metavar="GLOB",
        help="the public models it may use (globs, matched against each model's own name, not its aliases); "
        "'*' for every model",
    )
    kn.add_argument("--rpm", type=int)
    kn.add_argument("--tpm", type=int)
    kn.add_argument("--concurrency", type=int)
    ks.add_parser("digest", help="print the SHA-256 digest of a key read from stdin")

    u = sub.add_parser("usage", help="the usage ledger aggregated (from the database the config names)")
    u.add_argument("--config", default=os.environ.get("GATEWAY_CONFIG", DEFAULT_CONFIG))
    u.add_argument("--since", default="7d", help="30m, 24h, 7d, 2w, or a UTC date/time (default 7d)")
    u.add_argument("--until", help="default: now")
    u.add_argument("--by", default="key,model", help="key, model, backend, endpoint, outcome, day (comma-separated)")
    u.add_argument("--format", choices=("table", "csv", "json"), default="table")

    args = p.parse_args(argv)
    if args.cmd == "serve":
        return _serve(args.config, args.host, args.port)
    if args.cmd == "check-config":
        return _check(args.path)
    if args.cmd == "usage":
        return _usage(args.config, args.since, args.until, args.by, args.format)
    if args.keys_cmd == "new":
        return _new_key(args.name, args.models, args.rpm, args.tpm, args.concurrency)
    return _digest()


def _load(path: str) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return None


def _serve(path: str, host: str | None, port: int | None) -> int:
    from llm_gateway.app import create_app
    from llm_gateway.http.server import run
    from llm_gateway.observability.logs import setup_logging

    cfg = _load(path)
    if cfg is None:
        return 2
    setup_logging(cfg.server.log_level)
    app = create_app(cfg, config_path=path, host=host)
    run(app, cfg.server, host or cfg.server.host, port if port is not None else cfg.server.port)
    return 0


def _check(path: str) -> int:
    cfg = _load(path)
    if cfg is None:
        return 1
    print(f"{path}: OK")
    print(
        f"server: {cfg.server.host}:{cfg.server.port}  auth: {cfg.auth.mode} ({len(cfg.auth.keys)} keys)  "
        f"limits store: {cfg.limits.store}"
    )
    backends = {b.name: b for b in cfg.backends}
    print("\nbackends:")
    for b in cfg.backends:
        key = "engine key set" if b.api_key else "no engine key"
        print(f"  {b.name:<20} {b.engine:<13} {b.url:<36} capacity {b.capacity}, {key}")
    print("\nmodels (public name -> deployments -> backends):")
    for m in cfg.models:
        aliases = f" (aliases: {', '.join(m.aliases)})" if m.aliases else ""
        fallbacks = f"  fallbacks: {', '.join(m.fallbacks)}" if m.fallbacks else ""
        print(f"  {m.name}{aliases}  strategy: {m.strategy}{fallbacks}")
        for d in m.deployments:
            b = backends[d.backend]
            caps = ",".join(sorted(d.capabilities))
            print(
                f"    -> {d.model:<28} {d.format:<11} [{caps}] on {b.name} ({b.engine} at {b.url})"
                f" weight {d.weight:g} priority {d.priority}"
            )
    return 0


def _new_key(name: str, models: list[str], rpm: int | None, tpm: int | None, concurrency: int | None) -> int:
    key, digest = new_key()
    entry: dict[str, object] = {"name": name, "sha256": digest, "models": models}
    limits = {k: v for k, v in (("rpm", rpm), ("tpm", tpm), ("concurrency", concurrency)) if v is not None}
    if limits:
        entry["limits"] = limits
    print(f"key (shown once; give it to {name}, it is not stored anywhere):\n  {key}\n")
    print("add this under auth.keys in the config:")
    print(yaml.safe_dump([entry], sort_keys=False).rstrip())
    return 0


def _usage(path: str, since: str, until: str | None, by: str, fmt: str) -> int:
    import asyncio
    import time

    import orjson

    from llm_gateway.errors import DatabaseUnavailable
    from llm_gateway.state.database import Database
    from llm_gateway.state.usage import UsageStore, check_dimensions, parse_since, to_csv, to_table

    cfg = _load(path)
    if cfg is None:
        return 2
    now = time.time()
    try:
        since_ms = parse_since(since, now)
        until_ms = None if until is None else parse_since(until, now)
        dims = check_dimensions(by.split(","))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prices = {m.name: m.price for m in cfg.models if m.price is not None}

    async def report() -> list[UsageRow]:
        db = await Database.from_config(cfg)
        try:
            return await UsageStore(db).report(since_ms, dims, prices, until_ms)
        finally:
            await db.aclose()

    try:
        rows = asyncio.run(report())
    except DatabaseUnavailable as e:  # names the kind of failure, never the URL
        print(f"error: {e}", file=sys.stderr)
        return 1
    if fmt == "json":
        print(orjson.dumps([r.as_dict() for r in rows]).decode())
    elif fmt == "csv":
        sys.stdout.write(to_csv(rows, dims))
    else:
        if not cfg.usage.ledger:
            print("note: usage.ledger is off in this config: the gateway writes no new rows", file=sys.stderr)
        sys.stdout.write(to_table(rows, dims) if rows else "no requests in that time\n")
    return 0


def _digest() -> int:
    key = sys.stdin.readline().strip()
    if not key:
        print("error: no key on stdin", file=sys.stderr)
        return 1
    print(digest_of(key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
