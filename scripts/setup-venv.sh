#!/usr/bin/env bash
# Create (or reuse) the checkout's virtual environment in .venv and install opforge
# from this repository's own files, with PyTorch (CPU) and the test tools.
#
# The install (pip, and setup.py compiling the cpu backend's engine: 1.5-3 min) runs only
# when something it reads changed: .venv/.opforge-install-stamp holds a hash of the Python
# version, the extras, and every install input (pyproject.toml, setup.py and the modules
# it loads, the native sources and headers it compiles, this script), written after an
# install succeeds. The same hash and a .venv that imports opforge and torch: nothing to
# do. A fresh clone has no .venv and gets the full install. Python sources need no
# reinstall (the install is editable). OPFORGE_REINSTALL=1 forces the install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
extras="torch,test,cpu,quantize"
stamp=.venv/.opforge-install-stamp

install_inputs() {
    # one path a line, sorted: a file added or removed changes the hash too
    local f
    for f in pyproject.toml setup.py setup.cfg MANIFEST.in scripts/setup-venv.sh \
             opforge/backends/cpu/engine_build.py opforge/backends/cpu/fastcall.py \
             opforge/program/file_guard.py; do
        if [[ -f "$f" ]]; then echo "$f"; fi
    done
    find opforge -name _engine -prune -o -type f \
        \( -name '*.cpp' -o -name '*.cc' -o -name '*.c' -o -name '*.h' -o -name '*.hpp' \) \
        -print
}

fingerprint() {
    {
        python3 --version
        echo "extras $extras"
        install_inputs | LC_ALL=C sort | while IFS= read -r f; do sha256sum "$f"; done
    } | sha256sum | cut -d' ' -f1
}

want="$(fingerprint)"
if [[ "${OPFORGE_REINSTALL:-0}" != 1 && -x .venv/bin/python && -f "$stamp" ]] \
        && [[ "$(cat "$stamp")" == "$want" ]] \
        && .venv/bin/python -c "import opforge, torch" >/dev/null 2>&1; then
    echo "setup-venv: .venv is up to date (no install input changed since its last install;" \
         "OPFORGE_REINSTALL=1 reinstalls)" >&2
    exit 0
fi
rm -f "$stamp"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[$extras]"
echo "$want" > "$stamp"
