#!/usr/bin/env bash
# Build bench/.venv-external: torch, torchvision, timm and transformers beside opforge, for
# bench/external_models.py (models written elsewhere, exported and run on the lean runtime
# and on the cpu backend, and ONNX Runtime as the peer they are timed against).
#
#   bash bench/setup_external.sh            # create or update bench/.venv-external
#   PYTHON=python3.11 bash bench/setup_external.sh
#
# torch is 2.14.1 here, not opforge's 2.13.0: PyPI's torchvision builds for 2.13.0 fail to
# import beside it, and torchvision pins one torch. opforge is installed with --no-deps
# (its `torch` extra pins 2.13.0) and its other dependencies are named here. None of these
# packages becomes a dependency of opforge.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VENV="$HERE/.venv-external"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.14.1}"
TORCHVISION_VERSION="${TORCHVISION_VERSION:-0.29.1}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" --upgrade pip wheel setuptools

# torch and torchvision together, so the resolver takes the matching pair.
"${PIP[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
# timm and transformers: name torch beside them so pip keeps the one above.
"${PIP[@]}" timm transformers "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
# ONNX Runtime, the peer the external check times (--runtimes ...,ort), and what
# torch.onnx.export (the dynamo exporter) imports.
"${PIP[@]}" onnxruntime onnx onnxscript "torch==$TORCH_VERSION"

# opforge's own dependencies, read from pyproject.toml (its `dependencies` and the `cpu`
# extra), then opforge itself without them, so its `torch` extra's pin never replaces the
# torch above (tomllib: the venv needs Python 3.11 or newer).
mapfile -t OPFORGE_DEPS < <("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["cpu"]))
PY
)
"${PIP[@]}" "${OPFORGE_DEPS[@]}"
"${PIP[@]}" --no-deps -e "$ROOT"

# Check that everything imports, that the cpu backend is usable, and that export works.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for dist in ["torch", "torchvision", "timm", "transformers", "numpy", "onnxruntime", "opforge"]:
    print(f"{dist:13s} {md.version(dist)}")
import torch, torchvision, timm, transformers  # noqa: E401,F401
from opforge.backends import get_backend
from opforge.export import export
from opforge.runtime import load
problem = get_backend("cpu").unavailable()
print("cpu backend:", "usable" if problem is None else f"UNAVAILABLE ({problem})")
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
x = torch.randn(1, 3, 8, 8)
program = export(model, (x,), kernels="portable", backends=["cpu"] if problem is None else [])
got = load(program).method("forward")(x.numpy())[0]
err = float(abs(got - model(x).detach().numpy()).max())
print(f"export + run under torch {torch.__version__}: max error {err:.2e}")
assert err < 1e-4, err
PY
