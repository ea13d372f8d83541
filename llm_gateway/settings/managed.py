"""Managed backends: the command that starts a backend's engine, and the per-host memory budget and swap
groups that decide which managed engines may run at once (routing/managed.py runs them; README "Models on demand").
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from llm_gateway.adapters.model_loaders import LOADERS
from llm_gateway.settings.vocabulary import Name, Strict

PLACEHOLDERS = ("{port}", "{model}", "{host}")


class ManagedConfig(Strict):
    """A backend whose engine the gateway starts on the first request that needs it and stops when idle.

    `command` is an argv list (no shell); `{port}` (the port of the backend's URL), `{host}` (its host) and
    `{model}` (the upstream model of the backend's first deployment) are filled in, in `command` and `env`.
    With `loader` other than "process" the backend is one model of an engine that runs anyway and loads it
    through its own API (adapters/model_loaders.py): no command; loading it counts against the same budget.
    """

    loader: str = Field("process", description='"process" (start `command`) or an engine API: ' + ", ".join(LOADERS))
    command: tuple[str, ...] = Field((), description="argv of the engine; {port} {host} {model} filled in")
    env: dict[str, str] = Field(default_factory=dict, description="added to the gateway's environment")
    cwd: str | None = Field(None, description="working directory (None: the gateway's)")
    start_timeout_s: float = Field(120.0, gt=0, description="from spawn until the adapter's probe says ready")
    idle_ttl_s: float | None = Field(300.0, gt=0, description="stopped after this long with nothing to do; None: kept")
    memory_mb: float = Field(0.0, ge=0, description="what it holds while it runs, against its host's budget")
    host: Name = Field("local", description="the host whose memory budget it counts against")
    priority: int = Field(0, description="of two idle engines, the lower priority is unloaded first")
    max_restarts: int = Field(3, ge=0, description="restarts after crashes in a row before it is marked failed")
    restart_backoff_s: float = Field(1.0, ge=0, description="the first restart's delay, doubled for each next")
    stop_timeout_s: float = Field(10.0, gt=0, description="SIGTERM to its process group, then SIGKILL after this")

    @field_validator("command")
    @classmethod
    def _no_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if v and not v[0].strip():
            raise ValueError("the command's first word (the program) must not be empty")
        return v

    @model_validator(mode="after")
    def _loader_or_command(self) -> ManagedConfig:
        if self.loader == "process":
            if not self.command:
                raise ValueError('loader "process" needs a command')
        elif self.loader not in LOADERS:
            raise ValueError(f"unknown loader {self.loader!r}: process, {', '.join(LOADERS)}")
        elif self.command:
            raise ValueError(f'loader "{self.loader}" loads through the engine\'s API: give no command')
        return self


class ManagedHosts(Strict):
    """The memory budgets of the hosts managed engines run on, their swap groups, and the no-thrash rule of a
    swap. A swap group's backends exclude each other (one GPU, say): at most one of them runs at a time,
    whatever the budget; they must be managed backends of one host (checked in settings/gateway.py)."""

    memory_budget_mb: dict[Name, float] = Field(
        default_factory=dict, description="per host (ManagedConfig.host): MB its managed engines may hold; none: no cap"
    )
    swap_batch: int = Field(
        8, ge=1, description="once another model waits, a resident one admits at most this many newcomers"
    )
    swap_hold_s: float = Field(
        10.0, gt=0, description="once another model waits, a resident one admits newcomers for at most this long"
    )
    swap_groups: dict[Name, tuple[Name, ...]] = Field(
        default_factory=dict, description="group name: the managed backends of which at most one runs at a time"
    )

    def group_of(self) -> dict[str, frozenset[str]]:
        """Each grouped backend's group (itself included)."""
        return {b: frozenset(members) for members in self.swap_groups.values() for b in members}
