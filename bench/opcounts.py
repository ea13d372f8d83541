"""Bytecodes the gateway executes per request, by function: a count that repeats to the unit.

CPU time on this VM moves by several per cent between runs of one commit, and callgrind's instruction
count (instructions.py) says how much, not where. This runs the gateway (every feature on, bench's
config) in one process whose trace function counts each executed bytecode against its code object,
sends it N requests one at a time from this process (unary or streamed, on one kept-alive connection
or each on a new one) against the fake engine, and prints the bytecodes per request: the total, by
component (the gateway's subpackages, uvicorn, asyncio, the standard library) and by function. The
same commit gives the same count run after run (a streamed request's count moves by a few bytecodes
when the engine's events coalesce differently; unary ones not at all), so two commits compare by their
counts (`diff`), not by timings. Python only: C code (httptools, uvloop, orjson, the syscalls) costs
nothing here, and a bytecode's cost varies (a call costs more than a load); a change that trades
bytecodes for C calls is measured by instructions.sh or run.sh.

    bench/opcounts.py run [--gateway-dir DIR] [--requests N] [--tokens T] [--dialect D] [--new-connections]
                          [--agent] [--profile P] [--out F.json]
    bench/opcounts.py diff A.json B.json [--top N]

`--tokens 0` (the default) sends whole (non-streamed) requests; `--tokens 8` streams of 8 tokens at the
engine's `--tpot-ms`; `--dialect messages` or `responses` asks for them as Anthropic's or the Responses
API's (translated, as the board's msg64/resp64 do). `--agent` sends agent_request.py's 74 KB coding-agent
request (20 tools, 46 messages) in the dialect's own shape instead of request.json. `--profile` runs the
gateway with another of targets.py's configs (`ledger`, `team`, `traced`; default `minimal`, the bench's
config), so that what a feature adds on the event loop's thread is counted (threads it starts, such as the
ledger's writer, are not: only the main thread is traced). `--gateway-dir` counts
another checkout (a `git worktree` of the commit before a change), run by the same interpreter (BENCH_PY, as
every bench script).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


# -- the traced gateway (this file run as `_serve OUT -- <llm_gateway's arguments>`) --------------------------
def _serve(out: str, argv: list[str]) -> None:
    counts: collections.Counter[types.CodeType] = collections.Counter()
    on = False

    def local(frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return local

    def new_frame(frame: types.FrameType, event: str, arg: object) -> Any:
        if not on:
            return None
        frame.f_trace_opcodes = True
        return local

    def start(*_: object) -> None:
        nonlocal on
        Path(out + ".on").touch()  # the runner waits for this: the handler runs when the loop next wakes, not at once
        counts.clear()
        on = True

    def dump(*_: object) -> None:
        nonlocal on
        on = False
        import llm_gateway

        rows = [[c.co_filename, _name(c), c.co_firstlineno, n] for c, n in counts.items()]
        Path(out).write_text(json.dumps({"llm_gateway": llm_gateway.__file__, "functions": rows}))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)
    sys.argv = ["llm_gateway", *argv]
    sys.settrace(new_frame)
    runpy.run_module("llm_gateway", run_name="__main__", alter_sys=True)


def _name(code: types.CodeType) -> str:
    """The function's qualified name; for code made at run time, which all shares one name (dataclasses'
    `__init__`s are all `__create_fn__.<locals>.__init__` in `<string>`), its first arguments too."""
    if not code.co_filename.startswith("<string>"):
        return code.co_qualname
    args = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return f"{code.co_qualname}({', '.join(args[:5])}{', ...' if len(args) > 5 else ''})"


# -- the load: N requests, one at a time ------------------------------------------------------------------
def _request(port: int, tokens: int, dialect: str = "chat", agent: bool = False) -> bytes:
    import stream_client as sc
    import targets as tg

    if agent:  # agent_request.py's 74 KB coding-agent request, in the dialect's own shape
        import agent_request

        body = agent_request.bodies()[dialect]
        body["stream"] = tokens > 0
        if tokens:  # the dialect's own name for it: the Responses API refuses `max_tokens` (400)
            body["max_output_tokens" if dialect == "responses" else "max_tokens"] = tokens
        data = agent_request.encode(body)
    else:
        body = json.loads((BENCH / "request.json").read_bytes())
        body["stream"] = tokens > 0
        if tokens:
            body["max_tokens"] = tokens
        if dialect != "chat":  # the same stream asked for in another API (as the board's msg64/resp64 ask for it)
            body = sc.dialect_body(body, dialect, tokens)
        data = json.dumps(body).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in sc.request_headers(dialect, tg.API_KEY).items())
    return (
        f"POST {sc.PATHS[dialect]} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def _answer_done(buf: bytes, streamed: bool) -> bool:
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    if not head.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"the gateway answered {head[:200]!r}: {rest[:300]!r}")
    if streamed:
        return rest.endswith(b"0\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(rest) >= int(line[15:])
    raise RuntimeError("a whole answer without content-length")


def send_requests(
    port: int,
    n: int,
    tokens: int,
    new_connections: bool,
    timeout: float = 30.0,
    dialect: str = "chat",
    agent: bool = False,
) -> None:
    req = _request(port, tokens, dialect, agent)
    sock: socket.socket | None = None
    try:
        for _ in range(n):
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            sock.sendall(req)
            buf = b""
            while not _answer_done(buf, tokens > 0):
                data = sock.recv(65536)
                if not data:
                    raise RuntimeError("the gateway closed the connection mid-answer")
                buf += data
            if new_connections:
                sock.close()
                sock = None
    finally:
        if sock is not None:
            sock.close()


# -- a run ------------------------------------------------------------------------------------------------
def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float = 30.0) -> None:
    import procstat as ps

    ps.wait_until(lambda: proc.poll() is not None or not ps.port_free(port), timeout, 0.1)
    if proc.poll() is not None:
        raise RuntimeError(f"{what} exited ({proc.returncode}); see {log}")
    if ps.port_free(port):
        raise RuntimeError(f"{what} did not listen on {port} within {timeout:g}s; see {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(a: argparse.Namespace) -> dict[str, Any]:
    import procstat as ps
    import targets as tg

    work = Path(tempfile.mkdtemp(prefix="opcounts-"))
    e1, e2, gw = ps.free_port(), ps.free_port(), ps.free_port()
    urls = [f"http://127.0.0.1:{e1}", f"http://127.0.0.1:{e2}"]
    cfg = tg.write_gateway_config(work / "gateway.yaml", urls, profile=a.profile, data_dir=work / "data")
    out = work / "counts.json"
    elog, glog = work / "engine.log", work / "gateway.log"
    gdir = Path(a.gateway_dir).resolve()
    env = dict(os.environ, PYTHONPATH=str(gdir))
    with elog.open("wb") as ef, glog.open("wb") as gf:
        engine = subprocess.Popen(
            [sys.executable, str(BENCH / "fake_engine.py"), "--port", f"{e1},{e2}", "--tpot-ms", f"{a.tpot_ms:g}"],
            stdout=ef,
            stderr=subprocess.STDOUT,
        )
        gateway = None
        try:
            _wait_port(e2, engine, "the fake engine", elog)
            server = ("--host", "127.0.0.1", "--port", str(gw))
            gateway = subprocess.Popen(
                [sys.executable, __file__, "_serve", str(out), "--", *("serve", "--config", str(cfg)), *server],
                cwd=gdir,
                env=env,
                stdout=gf,
                stderr=subprocess.STDOUT,
            )
            _wait_port(gw, gateway, "the gateway", glog)
            send_requests(
                gw, a.warmup, a.tokens, a.new_connections, dialect=a.dialect, agent=a.agent
            )  # caches, pools, the first probes
            gateway.send_signal(signal.SIGUSR1)
            # counting starts when the gateway's loop runs the handler: on a busy box that was later than a fixed
            # 0.2 s, and a short run's requests went uncounted (the translated-streams test failed 2 of 3 so)
            if not ps.wait_until(Path(f"{out}.on").exists, 10, 0.01):
                raise RuntimeError(f"the gateway did not start counting; see {glog}")
            send_requests(gw, a.requests, a.tokens, a.new_connections, dialect=a.dialect, agent=a.agent)
            gateway.send_signal(signal.SIGUSR2)
            if not ps.wait_until(out.exists, 10, 0.05):
                raise RuntimeError(f"the gateway wrote no counts; see {glog}")
            time.sleep(0.2)  # the file is written in one call; let it finish
        finally:
            if gateway is not None:
                _stop(gateway)
            _stop(engine)
    data = json.loads(out.read_text())
    data["config"] = {
        "requests": a.requests,
        "tokens": a.tokens,
        "tpot_ms": a.tpot_ms,
        "new_connections": a.new_connections,
        "dialect": a.dialect,
        "agent": a.agent,
        "profile": a.profile,
        "gateway_dir": str(gdir),
        "python": sys.version.split()[0],
        "executable": sys.executable,
    }
    return data


# -- reading counts ---------------------------------------------------------------------------------------
_STDLIB = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"


def short(path: str) -> str:
    """A code object's file, short: `llm_gateway/...`, a site package's own path (`uvicorn/...`), `stdlib/...`."""
    p = path.replace("\\", "/")
    if "/llm_gateway/" in p:
        return "llm_gateway/" + p.rsplit("/llm_gateway/", 1)[1]
    if "/site-packages/" in p:
        return p.rsplit("/site-packages/", 1)[1]
    if p.startswith(_STDLIB):
        return "stdlib/" + p[len(_STDLIB) :]
    return p  # <string> (dataclasses' generated __init__ and the like), <frozen ...>, a script


def component(short_path: str) -> str:
    """What a file belongs to: the gateway's subpackage (or its top-level modules), a site package, the standard
    library's package or module."""
    parts = short_path.split("/")
    if parts[0] in ("llm_gateway", "stdlib") and len(parts) > 2:
        return f"{parts[0]}/{parts[1]}"
    if parts[0] == "llm_gateway":
        return "llm_gateway (top-level modules)"
    if parts[0] == "stdlib":
        return "stdlib/" + parts[1].removesuffix(".py")
    return parts[0].removesuffix(".py")


def per_function(data: dict[str, Any]) -> dict[tuple[str, str], float]:
    """{(file, qualified name): bytecodes per request}; keyed without line numbers, so that two commits whose
    functions moved within a file still compare."""
    n = data["config"]["requests"]
    out: dict[tuple[str, str], float] = collections.defaultdict(float)
    for path, name, _line, count in data["functions"]:
        out[(short(path), name)] += count / n
    return dict(out)


def report(data: dict[str, Any], top: int = 30) -> str:
    cfg = data["config"]
    funcs = per_function(data)
    total = sum(funcs.values())
    kind = f"streams of {cfg['tokens']} tokens" if cfg["tokens"] else "whole answers"
    conn = "each on a new connection" if cfg["new_connections"] else "on one kept-alive connection"
    lines = [
        f"{total:,.0f} bytecodes per request: {cfg['requests']} {kind}, {conn} (Python {cfg['python']}, "
        f"llm_gateway from {data['llm_gateway']})",
        "by component:",
    ]
    comps: collections.Counter[str] = collections.Counter()
    for (path, _name), v in funcs.items():
        comps[component(path)] += v  # type: ignore[assignment]
    lines += [f"  {v:8,.0f}  {c}" for c, v in comps.most_common() if v >= 0.5]
    lines.append(f"top {top} functions:")
    for (path, name), v in sorted(funcs.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {v:8,.1f}  {name}  ({path})")
    return "\n".join(lines)


def diff(a: dict[str, Any], b: dict[str, Any], top: int = 30) -> str:
    fa, fb = per_function(a), per_function(b)
    ta, tb = sum(fa.values()), sum(fb.values())
    lines = [f"bytecodes per request: {ta:,.0f} -> {tb:,.0f} ({tb - ta:+,.0f}, {100 * (tb - ta) / ta:+.1f} %)"]
    moves = sorted(((fb.get(k, 0.0) - fa.get(k, 0.0), k) for k in fa.keys() | fb.keys()), key=lambda m: -abs(m[0]))
    for d, (path, name) in moves[:top]:
        if abs(d) >= 0.5:
            lines.append(f"  {d:+8,.1f}  {name}  ({path})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:
        if sys.path and Path(sys.path[0]).resolve() == BENCH:
            del sys.path[0]  # the gateway sees the path it would see run as itself, not bench/'s modules
        sep = argv.index("--")
        _serve(argv[1], argv[sep + 1 :])
        return 0
    sys.path.insert(0, str(BENCH))
    ap = argparse.ArgumentParser(prog="bench/opcounts.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="count one checkout's bytecodes per request")
    r.add_argument("--gateway-dir", default=str(BENCH.parent), help="the checkout to count (default: this one)")
    r.add_argument("--requests", type=int, default=200, help="requests counted")
    r.add_argument("--warmup", type=int, default=20, help="requests sent before counting")
    r.add_argument("--tokens", type=int, default=0, help="0: whole answers; N: streams of N tokens")
    r.add_argument("--tpot-ms", type=float, default=1.0, help="the engine's delay between stream tokens")
    r.add_argument("--new-connections", action="store_true", help="each request on a new connection")
    r.add_argument(
        "--dialect", choices=("chat", "messages", "responses"), default="chat", help="streams asked for in this API"
    )
    r.add_argument(
        "--agent", action="store_true", help="agent_request.py's 74 KB coding-agent request instead of request.json"
    )
    r.add_argument(
        "--profile",
        choices=("minimal", "ledger", "team", "traced", "budget", "fairq", "admin"),
        default="minimal",
        help="the gateway's config (targets.PROFILES): what a feature adds on the loop",
    )
    r.add_argument("--top", type=int, default=30)
    r.add_argument("--out", help="write the counts here (JSON, for `diff`)")
    d = sub.add_parser("diff", help="compare two runs' counts by function")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    if a.cmd == "diff":
        print(diff(json.loads(Path(a.a).read_text()), json.loads(Path(a.b).read_text()), a.top))
        return 0
    data = run(a)
    if a.out:
        Path(a.out).write_text(json.dumps(data))
    print(report(data, a.top))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # `| head`: the rest is not wanted
        sys.stderr.close()
        raise SystemExit(0) from None
