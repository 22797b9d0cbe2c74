#!/usr/bin/env bash
# The README's test command: install, then run the whole test suite (slow tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
python -m pytest -q "$@"
