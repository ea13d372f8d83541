#!/usr/bin/env bash
# The bench in one command: installs what it needs (idempotent), then runs bench/run.py with the same options.
#   bench/run.sh                      # everything: ~15 min on the 2-core box (streams.py alone is ~7 min)
#   bench/run.sh --quick              # smoke run: 2 s per scenario, streams.py with 1,000 streams x 2 rounds
#   bench/run.sh --targets gateway,direct --scenarios ns_c1,ns_c64
#   bench/run.sh --table bench/results/run-XXXX.json   # re-print a saved run
# Installs: wrk (apt), the naive baseline's venv bench/.venvs/naive (requirements-naive.txt, PyPI), smg into
# bench/.venvs/smg (PyPI).
# LiteLLM is used when a venv has it ($LITELLM_VENV, else /tmp/litellm-venv, else bench/.venvs/litellm);
# BENCH_INSTALL_LITELLM=1 installs litellm[proxy]==${LITELLM_VERSION:-1.108.7} into bench/.venvs/litellm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
py="${BENCH_PY:-$repo/.venv/bin/python}"
# BENCH_INTERPRETER=/usr/bin/python3: every Python the bench runs (the gateway, the bare aiohttp proxy, the fake
# engine, the load clients) on that interpreter, from a venv made once for it with the project installed
# editable: bench/.venvs/py-<version>-<digest of its path>. The interpreter's build matters: pyenv's default
# (libpython as a shared library, no profile-guided build) costs the gateway up to ~10% more CPU than Debian's
# python3 or the Docker image's python:3.11-slim (see README, Performance).
if [ -n "${BENCH_INTERPRETER:-}" ] && [ -z "${BENCH_PY:-}" ]; then
  tag=$("$BENCH_INTERPRETER" -c 'import hashlib, sys; v = sys.version_info
print("%d.%d.%d-%s" % (v[0], v[1], v[2], hashlib.sha256(sys.executable.encode()).hexdigest()[:8]))')
  py="$here/.venvs/py-$tag/bin/python"
  if ! "$py" -c "import llm_gateway, aiohttp, uvloop, yaml" 2>/dev/null; then
    echo "bench: making a venv for $BENCH_INTERPRETER in $here/.venvs/py-$tag" >&2
    "$BENCH_INTERPRETER" -m venv --clear "$here/.venvs/py-$tag"
    "$py" -m pip install -q --disable-pip-version-check -c "$repo/constraints.txt" -e "$repo"
  fi
fi

if ! command -v wrk >/dev/null 2>&1; then
  echo "bench: installing wrk (apt)" >&2
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq && $sudo_ apt-get install -y -qq wrk >/dev/null
fi
if ! "$py" -c "import llm_gateway, aiohttp, uvloop, yaml" 2>/dev/null; then
  echo "bench: $py cannot import the project (gateway, aiohttp, uvloop, yaml): install it first," >&2
  echo "       e.g. python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'  (or set BENCH_PY)" >&2
  exit 1
fi
naive="$here/.venvs/naive"
if ! "$naive/bin/python" -c "import fastapi, httpx, uvicorn" 2>/dev/null; then
  echo "bench: creating the naive baseline's venv $naive" >&2
  "$py" -m venv --clear "$naive"
  "$naive/bin/pip" install -q --disable-pip-version-check -r "$here/requirements-naive.txt"
fi
# smg (SGLang / Shepherd Model Gateway, Rust): its own venv from PyPI, once (a marker file caches the attempt);
# when the install fails the smg column says "skipped: not installed" and the run goes on.
smg="$here/.venvs/smg"
if [ ! -x "$smg/bin/smg" ] && [ ! -e "$smg/.install-failed" ]; then
  echo "bench: installing smg ${SMG_VERSION:-1.13.0} into $smg (PyPI)" >&2
  if ! { "$py" -m venv --clear "$smg" && "$smg/bin/pip" install -q --disable-pip-version-check "smg==${SMG_VERSION:-1.13.0}"; }; then
    mkdir -p "$smg" && date > "$smg/.install-failed"
    echo "bench: smg install failed (rm $smg/.install-failed to retry): smg skipped: not installed" >&2
  fi
fi
if [ "${BENCH_INSTALL_LITELLM:-0}" = 1 ] && [ -z "${LITELLM_VENV:-}" ] && [ ! -x /tmp/litellm-venv/bin/litellm ] \
   && [ ! -x "$here/.venvs/litellm/bin/litellm" ]; then
  echo "bench: installing LiteLLM into $here/.venvs/litellm" >&2
  "$py" -m venv --clear "$here/.venvs/litellm"
  "$here/.venvs/litellm/bin/pip" install -q --disable-pip-version-check "litellm[proxy]==${LITELLM_VERSION:-1.108.7}"
fi
cd "$repo"
exec "$py" "$here/run.py" "$@"
