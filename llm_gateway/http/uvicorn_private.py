"""Every private part of uvicorn the gateway's server stands on, in one module.

The gateway's server is uvicorn's httptools protocol and request/response cycle, hardened against hostile clients
(hardened_protocol.py) and writing the app's answers directly (direct_cycle.py). uvicorn's public surface is
`uvicorn.Config`, `uvicorn.Server` and the protocol class a config names (`http=`); what the gateway uses beyond
it is imported here, and nowhere else:
- `HttpToolsProtocol`, subclassed: the gateway overrides its parser callbacks and replays its `__init__`;
- `RequestResponseCycle`, subclassed (`CoalescingCycle`); the protocol builds it inline, so the gateway's
  cycle is made by swapping the class of uvicorn's (`adopt_cycle`, the one place that does);
- `HEADER_RE`, `HEADER_VALUE_RE`, `STATUS_LINE`: the checks and status lines of the cycle's `send`, which the
  direct writes repeat; `HIGH_WATER_LIMIT`, the body size past which `on_body` (overridden) pauses reading;
- `ServerState`, which the protocol's constructor takes, and `Server._captured_signals` (`forget_sigterm`).

`PROTOCOL_METHODS`, `PROTOCOL_STATE`, `CYCLE_METHODS`, `CYCLE_STATE`, `FLOW_STATE`, `SERVER_METHODS` and
`SERVER_STATE` list what the gateway overrides, calls, reads or writes of each, with each method's parameters:
tests/unit/test_uvicorn_private.py checks them against the installed uvicorn and names what changed. pyproject.toml
allows only the minor version last checked (`CHECKED`), and constraints.txt pins its patch release.
"""

from __future__ import annotations

import signal
from typing import TypeGuard, TypeVar

import uvicorn
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

__all__ = [
    "CHECKED",
    "HEADER_RE",
    "HEADER_VALUE_RE",
    "HIGH_WATER_LIMIT",
    "STATUS_LINE",
    "HttpToolsProtocol",
    "RequestResponseCycle",
    "ServerState",
    "adopt_cycle",
    "forget_sigterm",
]

_Cycle = TypeVar("_Cycle", bound=RequestResponseCycle)

#: the uvicorn release this module was last checked against (pyproject.toml: `>=0.54,<0.55`)
CHECKED = "0.54.0"

#: HttpToolsProtocol's methods the gateway overrides or calls, with their parameters
PROTOCOL_METHODS: dict[str, tuple[str, ...]] = {
    "__init__": ("self", "config", "server_state", "app_state", "_loop"),  # replayed field for field
    "connection_made": ("self", "transport"),
    "connection_lost": ("self", "exc"),
    "data_received": ("self", "data"),
    "send_400_response": ("self", "msg"),
    "on_message_begin": ("self",),
    "on_headers_complete": ("self",),  # builds the cycle inline (`adopt_cycle`)
    "on_body": ("self", "body"),  # overridden: a body that comes in one piece is kept as it came
    "_should_upgrade": ("self",),  # called by the gateway's `on_body`, as uvicorn's calls it
    "on_message_complete": ("self",),
    "on_response_complete": ("self",),
    "_unset_keepalive_if_required": ("self",),
}
#: the protocol's fields that its `__init__` sets and the gateway's replays (hardened_protocol.GatewayProtocol), or
#: that the gateway reads: `url` and `headers` once parsed, `cycle` once built
PROTOCOL_STATE = (
    "config",
    "app",
    "loop",
    "logger",
    "access_logger",
    "access_log",
    "parser",
    "ws_protocol_class",
    "root_path",
    "asgi_version",
    "limit_concurrency",
    "app_state",
    "timeout_keep_alive_task",
    "timeout_keep_alive",
    "server_state",
    "connections",
    "tasks",
    "transport",
    "flow",
    "server",
    "client",
    "scheme",
    "pipeline",
    "scope",
    "headers",
    "expect_100_continue",
    "cycle",
)
#: RequestResponseCycle's methods: `send` extended (COALESCE), `receive` and `run_asgi` left as they are; the
#: gateway's cycle must not override `run_asgi`, whose coroutine exists before the class is swapped
CYCLE_METHODS: dict[str, tuple[str, ...]] = {
    "__init__": (
        "self",
        "scope",
        "transport",
        "flow",
        "logger",
        "access_logger",
        "access_log",
        "default_headers",
        "message_event",
        "expect_100_continue",
        "keep_alive",
        "on_response",
    ),
    "send": ("self", "message"),
    "receive": ("self",),
    "run_asgi": ("self", "app"),
}
#: the cycle's fields the direct writes read and write as its `send` and `receive` do (direct_cycle.py)
CYCLE_STATE = (
    "scope",
    "transport",
    "flow",
    "access_log",
    "default_headers",
    "message_event",
    "on_response",
    "disconnected",
    "keep_alive",
    "waiting_for_100_continue",
    "body",
    "more_body",
    "response_started",
    "response_complete",
    "chunked_encoding",
    "expected_content_length",
)
#: the cycle's flow control (uvicorn's FlowControl): read, and `resume_reading` called, as `receive` does
FLOW_STATE = ("write_paused", "resume_reading")
#: uvicorn.Server's methods the gateway's servers override or call (http/server.py, admin/server.py)
SERVER_METHODS: dict[str, tuple[str, ...]] = {
    "startup": ("self", "sockets"),
    "shutdown": ("self", "sockets"),
    "serve": ("self", "sockets"),
    "capture_signals": ("self",),
}
#: uvicorn.Server's fields the gateway's server reads after `startup` (`servers`, `lifespan`: set by it) or writes
SERVER_STATE = ("config", "server_state", "started", "should_exit", "_captured_signals", "servers", "lifespan")


def adopt_cycle(cycle: RequestResponseCycle, cls: type[_Cycle]) -> TypeGuard[_Cycle]:
    """Make the cycle uvicorn has just built for a request one of the gateway's class `cls`, in place; False
    (nothing done) where it is not uvicorn's plain cycle.

    Why a class swap: `HttpToolsProtocol.on_headers_complete` builds the cycle inline, by the module's global name
    `RequestResponseCycle(...)` (no factory, no class attribute to override), and in the same call creates the
    task that runs it (or queues it behind a pipelined request). Replacing that global would change every uvicorn
    server in the process; copying `on_headers_complete` would copy some forty lines of uvicorn that change more
    often than the cycle's fields. So the caller swaps the class right after that call, before the task first
    runs: the task's coroutine is `run_asgi` (already bound: `cls` must not override it), and the app's `send` is
    the cycle's, looked up when `run_asgi` starts, so it is `cls`'s. `cls` adds methods and class attributes only
    (no `__slots__`, no `__init__`), so uvicorn's instance is a complete one of it."""
    if type(cycle) is not RequestResponseCycle:
        return False
    cycle.__class__ = cls
    return True


def forget_sigterm(server: uvicorn.Server) -> None:
    """Forget a SIGTERM the server captured: uvicorn re-raises the signals it captured once it has shut down
    (`Server.capture_signals`), which makes a SIGTERM answered by draining a death by signal; forgotten, the
    process exits with status 0."""
    server._captured_signals = [s for s in server._captured_signals if s != signal.SIGTERM]
