#!/usr/bin/env bash
# Set everything up (.venv in the checkout) and run the test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-venv.sh"
cd "$root"
exec .venv/bin/python -m pytest -n 2 -q "$@"
