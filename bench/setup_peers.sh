#!/usr/bin/env bash
# Build bench/.venv-peers: one interpreter that can run opforge and every peer runtime
# (torch eager, ONNX Runtime, ExecuTorch) so run.py measures them all in one run.
#
#   bash bench/setup_peers.sh            # create or update bench/.venv-peers
#   PYTHON=python3.11 bash bench/setup_peers.sh
#
# opforge never depends on the peers: they live only in this venv. ExecuTorch is
# optional: if it cannot be installed the suite still runs and reports it unavailable.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VENV="$HERE/.venv-peers"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
EXECUTORCH_VERSION="${EXECUTORCH_VERSION:-1.5.1}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" --upgrade pip wheel setuptools

# torch first and explicitly: pip takes the local CPU wheel, and every later install
# (executorch pins torch) then sees it already satisfied instead of fetching another.
"${PIP[@]}" "torch==$TORCH_VERSION"

# ONNX Runtime, plus what torch.onnx.export (the dynamo exporter in torch 2.13) imports.
"${PIP[@]}" onnxruntime onnx onnxscript matplotlib numpy pyyaml jinja2 click rich defusedxml \
    cmake ninja
# opforge-cpu: the cpu backend's oneDNN (the CPU/GNU-OpenMP build) and its headers
"${PIP[@]}" onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0

# ExecuTorch: its wheel pins torch; name torch beside it so the resolver keeps ours.
if ! "${PIP[@]}" "executorch==$EXECUTORCH_VERSION" "torch==$TORCH_VERSION"; then
    echo "setup_peers: executorch==$EXECUTORCH_VERSION could not be installed;" \
         "run.py will report ExecuTorch as unavailable" >&2
fi

# py-spy, for profiling the opforge runtime (optional).
"${PIP[@]}" py-spy || echo "setup_peers: py-spy not installable; profiles use cProfile only" >&2

# opforge itself, without letting pip touch the peers' pins.
"${PIP[@]}" --no-deps -e "$ROOT"

# Check that every peer imports, and show what pip picked.
"$VENV/bin/python" - <<'PY'
import importlib, importlib.metadata as md
for dist in ["torch", "numpy", "onnxruntime", "onnx", "onnxscript", "matplotlib", "executorch",
             "py-spy", "opforge"]:
    try:
        print(f"{dist:12s} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist:12s} NOT INSTALLED")
for module in ["onnxruntime", "executorch", "executorch.extension.pybindings.portable_lib",
               "executorch.backends.xnnpack.partition.xnnpack_partitioner", "opforge.runtime"]:
    try:
        importlib.import_module(module)
        print(f"import {module}: ok")
    except Exception as error:  # report, don't fail: run.py marks the runtime unavailable
        print(f"import {module}: UNAVAILABLE ({type(error).__name__}: {error})")
PY
