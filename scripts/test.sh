#!/usr/bin/env bash
# The README's test command: install, then run the whole test suite (slow tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
# property tests on fixed seeds (tests/conftest.py); GRADSCHED_HYPOTHESIS=explore draws new examples
GRADSCHED_HYPOTHESIS="${GRADSCHED_HYPOTHESIS:-ci}" python -m pytest -q "$@"
