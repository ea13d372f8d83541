"""Top functions of a gateway profile, and where the time goes: own code vs uvicorn vs aiohttp vs stdlib.

`from_collapsed` reads py-spy's raw (collapsed stacks) output, `from_pstats` a cProfile file. Both print
self time (the function itself) and inclusive time (it and what it calls), top 30 each, and a summary
by component. With py-spy, time spent in uvloop's C event loop (epoll, socket reads and writes done by
the loop itself) shows as self time of the bottom Python frame, `Runner.run`.
"""

from __future__ import annotations

import io
import pstats
import re
from collections import Counter
from pathlib import Path

THIRD_PARTY = {
    "uvicorn": "uvicorn",
    "aiohttp": "aiohttp (+multidict, yarl)",
    "multidict": "aiohttp (+multidict, yarl)",
    "yarl": "aiohttp (+multidict, yarl)",
    "propcache": "aiohttp (+multidict, yarl)",
    "aiohappyeyeballs": "aiohttp (+multidict, yarl)",
    "aiosignal": "aiohttp (+multidict, yarl)",
    "frozenlist": "aiohttp (+multidict, yarl)",
    "prometheus_client": "prometheus_client",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "uvloop": "uvloop",
    "httptools": "httptools",
    "orjson": "orjson",
    "httpx": "httpx",
    "httpcore": "httpx",
    "redis": "redis",
    "yaml": "yaml",
}
# below the event loop: not "own work"
ENTRY = ("llm_gateway/__main__.py", "llm_gateway/cli.py", "llm_gateway/http/server.py")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")


LIBUV = ("core.c", "stream.c", "linux.c", "tcp.c", "timer.c", "loop-watcher.c", "queue.h", "udp.c", "async.c")


def native_component(path: str, func: str) -> str:
    """Component of a native frame (py-spy --native)."""
    base = path.rsplit("/", 1)[-1].split(":", 1)[0]
    if func.startswith(("gc_collect", "collect", "deduce_unreachable", "move_unreachable", "subtract_refs")):
        return "CPython cyclic GC"
    if base == "loop.c" or base in LIBUV or func.startswith("uv_"):
        return "uvloop + libuv (C)"
    if base.startswith("libc.so") or func in ("write", "read", "writev", "epoll_wait", "getpid"):
        return "libc (syscalls)"
    if base in ("parser.c", "_http_parser.c", "llhttp.c", "http.c", "api.c"):
        return "HTTP parsers (httptools, aiohttp, C)"
    if base.startswith("orjson"):
        return "orjson"
    return "CPython runtime (C: refcounts, frames, dicts)"


def component(path: str, func: str = "") -> str:
    p = path
    if p and not p.endswith(".py") and not p.startswith("<") and "/" not in p.removesuffix(".py"):
        return native_component(p, func)
    own = "llm_gateway/"
    if p.startswith(own) or (f"/{own}" in p and "site-packages" not in p):
        return "gateway + adapters (own code)"
    if "site-packages/" in p:
        p = p.split("site-packages/", 1)[1]
    top = p.split("/", 1)[0].removesuffix(".py")
    if func == "Runner.run":  # py-spy: the bottom Python frame; its self time is uvloop's C loop
        return "uvloop C event loop (epoll, socket I/O)"
    if top in THIRD_PARTY:
        return THIRD_PARTY[top]
    if top == "asyncio" or "/asyncio/" in p:
        return "stdlib asyncio"
    return "stdlib, other"


def _strip(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    return f"{m['func']} ({m['file']})", m["file"]


def from_collapsed(text: str, title: str = "", threads_note: str = "") -> str:
    """py-spy raw output -> report. Stacks of threads other than the event loop's (rooted in
    `Thread._bootstrap`) are counted apart: py-spy reports the gateway's idle executor threads as busy
    (their CPU time in /proc is ~0; `threads_note` can say so with numbers)."""
    other_threads = 0
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    comp: Counter[str] = Counter()
    comp_incl_own = 0
    files: dict[str, str] = {}
    total = 0
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if any(f.startswith(("Thread._bootstrap ", "thread_run ")) for f in frames[:8]):
            other_threads += count
            continue
        total += count
        names = []
        for f in frames:
            name, path = _strip(f)
            files[name] = path
            names.append(name)
        leaf = names[-1]
        self_c[leaf] += count
        func = leaf.split(" (", 1)[0]
        comp[component(files[leaf], func)] += count
        for name in set(names):
            incl[name] += count
        if any(component(files[x]) == "gateway + adapters (own code)" and files[x] not in ENTRY for x in names):
            comp_incl_own += count
    text = _render(title, total, self_c, incl, comp, comp_incl_own, "samples of the event-loop thread")
    if other_threads:
        text += f"\n(left out: {other_threads:,} samples of other threads. {threads_note})\n"
    return text


def from_pstats(path: Path, title: str = "") -> str:
    st = pstats.Stats(str(path))
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    comp: Counter[str] = Counter()
    for (file, line, func), (_cc, _nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        name = f"{func} ({_short(file)}:{line})"
        self_c[name] += round(tt * 1e6)
        incl[name] += round(ct * 1e6)
        comp[component(_short(file), func) if file != "~" else "C builtins (orjson, uvloop, sockets...)"] += round(
            tt * 1e6
        )
    own_incl = max((v for k, v in incl.items() if component(k.split("(")[-1]) == "gateway + adapters (own code)"),
                   default=0)  # fmt: skip
    text = _render(title, round(total * 1e6), self_c, incl, comp, own_incl, "µs (cProfile)")
    buf = io.StringIO()
    pstats.Stats(str(path), stream=buf).sort_stats("tottime").print_stats(30)
    return text + "\n\npstats, sorted by tottime:\n" + buf.getvalue()


def _short(file: str) -> str:
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1]
    own = "/llm_gateway/"
    if own in file:
        return own[1:] + file.split(own, 1)[1]
    if "/lib/python3" in file:
        return file.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return file


def _render(title: str, total: int, self_c: Counter, incl: Counter, comp: Counter, own_incl: int, unit: str) -> str:
    if not total:
        return f"{title}: no samples"
    pct = lambda n: f"{100 * n / total:5.1f}%"  # noqa: E731
    out = [f"# {title}: {total:,} {unit}", "", "## time by component (self time)"]
    for name, n in comp.most_common():
        out.append(f"{pct(n)}  {name}")
    out.append(f"(inclusive: samples inside llm_gateway/ code or what it calls: {pct(own_incl)})")
    out += ["", "## top 30 by self time"]
    out += [f"{pct(n)}  {name}" for name, n in self_c.most_common(30)]
    out += ["", "## top 30 by inclusive time"]
    out += [f"{pct(n)}  {name}" for name, n in incl.most_common(30)]

    def is_own(name: str) -> bool:
        path = name.rsplit("(", 1)[-1].rstrip(")").split(":", 1)[0]
        return component(path) == "gateway + adapters (own code)" and path not in ENTRY

    own = Counter({k: v for k, v in self_c.items() if is_own(k)})
    out += ["", "## own code (llm_gateway/), top 20 by self time"]
    out += [f"{pct(n)}  {name}" for name, n in own.most_common(20)]
    own_incl = Counter({k: v for k, v in incl.items() if is_own(k)})
    out += ["", "## own code, top 25 by inclusive time (the function and everything it calls)"]
    out += [f"{pct(n)}  {name}" for name, n in own_incl.most_common(25)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    src = Path(sys.argv[1])
    print(from_pstats(src, src.name) if src.suffix == ".pstats" else from_collapsed(src.read_text(), src.name))
