#!/usr/bin/env bash
# Set everything up (.venv in the checkout) and run the test suite (arguments go to this
# main run), then the kernel tests whose special values (±inf, NaN, overflow) meet ATen's
# vectorised code a second time under ATEN_CPU_CAPABILITY=default, ATen's other code path,
# so that every machine proves them both with its best vector code and without it.
# Fails when either run fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup-venv.sh"
bash "$root/scripts/setup-cross.sh"  # the aarch64 tests' toolchain and qemu (never fails)
cd "$root"
status=0
.venv/bin/python -m pytest -n 2 -q "$@" || status=$?
# The files comparing special values with PyTorch: GELU, unary math, OpInfo's extremal
# samples, atan2, softmax and logsumexp of -inf rows. Files go whole to a worker
# (--dist loadfile): split across workers, OpInfo's sample plans are built twice and the
# pass costs twice the CPU. Measured with -n 2 on 2 cores, nothing else heavy: 38 s
# (every tests/torch/test_kernels_*.py takes ~70 s even then, so this subset); with other
# jobs sharing the cores (load ~4.5), 70 s.
kernel_tests=(
    tests/torch/test_kernels_gelu.py tests/torch/test_kernels_unary.py
    tests/torch/test_kernels_opinfo.py tests/torch/test_kernels_more.py
    tests/torch/test_kernels_reduction.py tests/torch/test_kernels_norm_small.py
    tests/torch/test_kernels_softmax_extreme.py
)
ATEN_CPU_CAPABILITY=default .venv/bin/python -m pytest -n 2 --dist loadfile -q -p no:cacheprovider \
    "${kernel_tests[@]}" || { rc=$?; ((status)) || status=$rc; }
exit "$status"
