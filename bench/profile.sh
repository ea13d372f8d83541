#!/usr/bin/env bash
# Profile the gateway under load: bench/profile.sh [py-spy|cprofile] [more run.py options]
#   py-spy (default): samples the running gateway (200 Hz; py-spy pauses the process for each sample, so
#     req/s while profiling are lower) during the measured window of ns_c64
#     and st64_c16; writes bench/results/run-<time>/profile-<scenario>.svg (flamegraph),
#     profile-<scenario>.collapsed.txt (for speedscope / flamegraph.pl) and profile-<scenario>-top.txt
#     (top 30 by self and inclusive time, and time by component: own code, uvicorn, aiohttp, stdlib).
#   cprofile: one gateway process per scenario under `python -m cProfile`; writes profile-<scenario>.pstats
#     and profile-<scenario>-top.txt. cProfile slows Python code ~2x, so its req/s are not comparable.
#   PYSPY_NATIVE=1 adds C frames (py-spy --native): the cyclic GC, uvloop/libuv, refcounting and syscalls then
#     show as their own components instead of inside the Python frame that called them.
# Installs py-spy into bench/.venvs/tools (PyPI) when missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
py="${BENCH_PY:-$repo/.venv/bin/python}"
prof="py-spy"
if [ "${1:-}" = "py-spy" ] || [ "${1:-}" = "cprofile" ]; then prof="$1"; shift; fi
if [ "$prof" = "py-spy" ] && [ ! -x "$here/.venvs/tools/bin/py-spy" ]; then
  echo "bench: installing py-spy into $here/.venvs/tools" >&2
  "$py" -m venv --clear "$here/.venvs/tools"
  "$here/.venvs/tools/bin/pip" install -q --disable-pip-version-check "py-spy==${PYSPY_VERSION:-0.4.3}"
fi
command -v wrk >/dev/null 2>&1 || { echo "bench: wrk missing; run bench/run.sh once (it installs it)" >&2; exit 1; }
cd "$repo"
exec "$py" "$here/run.py" --targets gateway --scenarios ns_c64,st64_c16 --profile "$prof" "$@"
