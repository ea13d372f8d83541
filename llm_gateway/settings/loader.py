"""Reading a config file: YAML with line numbers, `${VAR}` expansion, and errors that say where.

`load_config(path)` returns a validated, frozen `GatewayConfig` or raises `ConfigError` whose
message names the file, the field and, where YAML gives it, the line. Nothing is half-applied:
a file is parsed and validated completely before anything uses it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from llm_gateway.settings import GatewayConfig

DEFAULT_CONFIG = "config/gateway.yaml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_PATH_PREFIX = re.compile(r"^(?:Value error, )?([A-Za-z_][\w]*(?:\[\d+\]|\.[A-Za-z_][\w]*)*): (.*)$", re.S)

Loc = tuple[str | int, ...]


class ConfigError(Exception):
    """A config file that cannot be used; the message is ready to show to a person."""


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> GatewayConfig:
    env = os.environ if env is None else env
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: config file is not UTF-8: {e}") from None
    return parse_config(text, str(p), env)


def parse_config(text: str, source: str, env: Mapping[str, str]) -> GatewayConfig:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    lines: dict[Loc, int] = {}
    if node is not None:
        _record_lines(node, (), lines)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping (section: value), not {type(data).__name__}")
    data = _expand(data, (), env, source, lines)
    try:
        return GatewayConfig(**data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source, lines)) from None
    except ValueError as e:  # raised by validators outside pydantic's wrapping
        raise ConfigError(f"{source}: {e}") from None


def _record_lines(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            lines[(*loc, key)] = k.start_mark.line + 1
            _record_lines_child(v, (*loc, key), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _record_lines(v, (*loc, i), lines)


def _record_lines_child(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    keep = lines[loc]
    _record_lines(node, loc, lines)
    if not isinstance(node, yaml.ScalarNode):
        lines[loc] = keep  # a section's line is its key's line


def _expand(value: Any, loc: Loc, env: Mapping[str, str], source: str, lines: dict[Loc, int]) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(f"{_where(source, loc, lines)}: {_dotted(loc)}: environment variable {name} is not set")

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, (*loc, k), env, source, lines) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*loc, i), env, source, lines) for i, v in enumerate(value)]
    return value


def _format_errors(e: ValidationError, source: str, lines: dict[Loc, int]) -> str:
    out = [f"{source}: invalid configuration ({e.error_count()} error{'s' * (e.error_count() != 1)})"]
    for err in e.errors(include_url=False, include_input=False):
        loc: Loc = tuple(x for x in err["loc"] if isinstance(x, str | int))
        msg = err["msg"]
        m = _PATH_PREFIX.match(msg)
        if not loc and m:
            loc = _parse_dotted(m.group(1))
            msg = m.group(2)
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append(f"  {_where(source, loc, lines)}: {_dotted(loc) or '(top level)'}: {msg}")
    return "\n".join(out)


def _where(source: str, loc: Loc, lines: dict[Loc, int]) -> str:
    for n in range(len(loc), -1, -1):
        line = lines.get(loc[:n])
        if line is not None and (n > 0 or not loc):
            return f"{source}:{line}"
    return source


def _dotted(loc: Loc) -> str:
    s = ""
    for part in loc:
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else part)
    return s


def _parse_dotted(path: str) -> Loc:
    out: list[str | int] = []
    for name, idx in re.findall(r"([A-Za-z_]\w*)|\[(\d+)\]", path):
        out.append(name if name else int(idx))
    return tuple(out)
