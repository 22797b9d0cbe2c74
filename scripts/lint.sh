#!/usr/bin/env bash
# The lint and type checks (run by scripts/test.sh before the tests; configured in pyproject.toml):
# ruff over src/ tests/ benchmarks/ examples/, and mypy on the torch-free core ([tool.mypy] files).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || [ ! -f .venv/bin/activate ] || . .venv/bin/activate  # scripts/install.sh's
echo "ruff check src tests benchmarks examples"
python -m ruff check --quiet src tests benchmarks examples
echo "mypy (the core: pyproject.toml [tool.mypy] files)"
python -m mypy
