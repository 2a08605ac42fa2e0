#!/usr/bin/env bash
# Set everything up (.venv in the checkout) and run the main job on the bundled example.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-venv.sh"
cd "$root"
exec .venv/bin/opforge example "$@"
