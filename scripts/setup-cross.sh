#!/usr/bin/env bash
# Install the aarch64 cross toolchain and user-mode emulation the ARM tests use
# (tests/native_runtime/test_aarch64.py, docs/arm.md): Debian/Ubuntu's g++-aarch64-linux-gnu
# and qemu-user. Idempotent: nothing happens when the tools are on PATH already. Never fails:
# without apt (or without root and password-less sudo) it says so and the ARM tests skip,
# naming what is missing. OPFORGE_NO_CROSS=1 skips it.
set -uo pipefail
tools=(aarch64-linux-gnu-g++ aarch64-linux-gnu-gcc qemu-aarch64)
missing=()
for t in "${tools[@]}"; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ "${OPFORGE_NO_CROSS:-0}" == 1 ]]; then
    echo "setup-cross: OPFORGE_NO_CROSS=1: not installing ${missing[*]} (the ARM tests skip)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-cross: no apt-get here: ${missing[*]} not installed (the ARM tests skip)" >&2
    exit 0
fi
if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "setup-cross: not root and no password-less sudo: ${missing[*]} not installed" \
         "(the ARM tests skip)" >&2
    exit 0
fi
echo "setup-cross: installing g++-aarch64-linux-gnu qemu-user (for ${missing[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
if ! "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
        g++-aarch64-linux-gnu qemu-user >/dev/null 2>&1; then
    # the package lists may be missing or stale on a fresh machine
    "${as_root[@]}" apt-get update -qq >/dev/null 2>&1
    "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
        g++-aarch64-linux-gnu qemu-user >/dev/null 2>&1 \
        || echo "setup-cross: apt-get install failed (the ARM tests skip)" >&2
fi
exit 0
