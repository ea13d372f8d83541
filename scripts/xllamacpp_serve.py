#!/usr/bin/env python3
"""Run llama.cpp's own server in-process from the `xllamacpp` wheel (same server code as the
`llama-server` binary, installs in seconds instead of an 8-minute build). Used by quickstart.sh.

    xllamacpp_serve.py --model tiny.gguf [--alias tiny-llama] [--host 127.0.0.1] [--port 8081]
                       [--parallel 2] [--ctx 4096] [--threads 1]

Serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import threading

import xllamacpp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--alias", default="tiny-llama")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    p = xllamacpp.CommonParams()
    p.model.path = a.model
    p.model_alias = {a.alias}
    p.hostnames = [a.host]
    p.port = a.port
    p.n_parallel = a.parallel
    p.n_ctx = a.ctx
    p.endpoint_metrics = True
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    p.warmup = False

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xllamacpp.Server(p)
    print(f"llama.cpp server (xllamacpp) listening on {server.listening_address}", flush=True)
    stop.wait()
    del server


if __name__ == "__main__":
    main()
