#!/usr/bin/env bash
# Create .venv and install gradsched with its test and runtime dependencies.
# torch is pinned to the 2.13.0 CPU build here (it installs from local disk on
# the project's machines); GPU users install any torch>=2.4 first and skip the pin.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The testbed (network namespaces, tc) needs iproute2 and sysctl; install them as root if missing.
if [ "$(id -u)" = 0 ] && ! { command -v ip && command -v tc && command -v sysctl; } >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq iproute2 procps) >/dev/null 2>&1 || echo "warning: could not install iproute2/procps; testbed tests will skip" >&2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test,plot]"
