#!/usr/bin/env bash
# Create (or reuse) the checkout's virtual environment in .venv and install opforge
# from this repository's own files, with PyTorch (CPU) and the test tools.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[torch,test,cpu,quantize]"
