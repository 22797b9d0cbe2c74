#!/usr/bin/env bash
# The README's test command: install, lint and type-check, then run the whole test suite (slow tests
# included) on 2 workers (GRADSCHED_TEST_WORKERS=0: one process, as plain pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
bash scripts/lint.sh  # ruff and mypy (pyproject.toml)
python -m gradsched.jit  # numba's kernels compiled once (a fresh clone: ~50 s of CPU), then loaded by every worker
# each test file on one worker; the testbed and wall-clock files one at a time (tests/conftest.py)
workers="${GRADSCHED_TEST_WORKERS:-2}"
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadfile)
# property tests on fixed seeds (tests/conftest.py); GRADSCHED_HYPOTHESIS=explore draws new examples
GRADSCHED_HYPOTHESIS="${GRADSCHED_HYPOTHESIS:-ci}" python -m pytest -q "${parallel[@]}" "$@"
