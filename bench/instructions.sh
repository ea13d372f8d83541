#!/usr/bin/env bash
# User-space instructions per stream under callgrind (bench/instructions.py): bench/instructions.sh [options]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command -v valgrind >/dev/null 2>&1 || { echo "bench: valgrind missing (apt-get install valgrind)" >&2; exit 1; }
exec "${BENCH_PY:-$(dirname "$here")/.venv/bin/python}" "$here/instructions.py" "$@"
