"""CLI: ``python -m llm_gateway_emulators ENGINE [options]`` runs one emulator until SIGTERM/SIGINT.

Prints ``listening on http://HOST:PORT`` (flushed) once the port accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from llm_gateway_emulators.config import ENGINES, EmulatorConfig, check_fault
from llm_gateway_emulators.server import Emulator

DEFAULT_PORTS = {
    "llama-server": 8080,
    "vllm": 8000,
    "sglang": 30000,
    "ollama": 11434,
    "tabbyapi": 5000,
    "lmdeploy": 23333,
    "aphrodite": 2242,
    "trtllm": 8000,
    "tgi": 3000,
    "mlc": 8000,
    "lmstudio": 1234,
    "dynamo": 8000,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m llm_gateway_emulators", description=__doc__)
    p.add_argument("engine", choices=ENGINES)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default: the engine's own port; 0 = any free port")
    p.add_argument("--model", default="tiny")
    p.add_argument("--api-key", default=None)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--tpot-ms", type=float, default=0.0)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--load-delay-s", type=float, default=0.0)
    p.add_argument("--fault", default=None)
    p.add_argument("--fault-after-chunks", type=int, default=2)
    p.add_argument("--fault-count", type=int, default=None)
    p.add_argument("--embeddings", action="store_true")
    p.add_argument("--scoring", action="store_true", help="vLLM: a score model (/rerank, /score)")
    p.add_argument("--speech", action="store_true", help="vLLM: a speech model (/v1/audio/*)")
    p.add_argument("--no-metrics", action="store_true")
    p.add_argument("--ping-interval-s", type=float, default=15.0)
    p.add_argument("--ctx-len", type=int, default=4096)
    p.add_argument("--natural-stop-tokens", type=int, default=16)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="any other EmulatorConfig knob, VALUE as JSON (else a string); repeatable",
    )
    args = p.parse_args(argv)
    try:
        check_fault(args.fault)
        args.extra = dict(_knob(item) for item in args.set)
        config_from(args)
    except ValueError as exc:
        p.error(str(exc))
    return args


def _knob(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep:
        raise ValueError(f"--set expects KNOB=VALUE, got {item!r}")
    try:
        return key.strip(), json.loads(raw)
    except ValueError:
        return key.strip(), raw


def config_from(args: argparse.Namespace) -> EmulatorConfig:
    cfg = EmulatorConfig(
        engine=args.engine,
        model=args.model,
        api_key=args.api_key,
        ttft_ms=args.ttft_ms,
        tpot_ms=args.tpot_ms,
        slots=args.slots,
        max_queue=args.max_queue,
        load_delay_s=args.load_delay_s,
        fault=args.fault,
        fault_after_chunks=args.fault_after_chunks,
        fault_count=args.fault_count,
        embeddings=args.embeddings,
        scoring=args.scoring,
        speech=args.speech,
        metrics=not args.no_metrics,
        ping_interval_s=args.ping_interval_s,
        ctx_len=args.ctx_len,
        natural_stop_tokens=args.natural_stop_tokens,
    )
    cfg.merge(getattr(args, "extra", {}))
    return cfg


async def serve(args: argparse.Namespace) -> None:
    port = DEFAULT_PORTS[args.engine] if args.port is None else args.port
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Emulator(config_from(args), host=args.host, port=port) as emu:
        waiter = asyncio.ensure_future(emu.wait_listening())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done():
            print(f"listening on {emu.url}", flush=True)
            await stopper
        waiter.cancel()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args))
    except ImportError:  # pragma: no cover
        asyncio.run(serve(args))
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
