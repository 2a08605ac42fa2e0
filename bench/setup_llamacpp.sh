#!/usr/bin/env bash
# Build llama.cpp from source as a peer of bench/llm.py (issue 46, item 7).
#
#   bash bench/setup_llamacpp.sh                 # download, unpack, build (idempotent)
#   PYTHON=bench/.venv-peers/bin/python bash bench/setup_llamacpp.sh
#   LLAMACPP_JOBS=8 bash bench/setup_llamacpp.sh  # a quiet machine with more cores
#
# The llama-cpp-python sdist from the registry bundles a llama.cpp tree under
# vendor/llama.cpp, so the peer comes from the ordinary package client (no git clone):
# pip downloads the sdist, we unpack it into bench/work/llamacpp/ (gitignored) and build
# only what the benchmark needs, CPU only, for this machine (GGML_NATIVE=ON, Release):
#   llama-bench     prompt/decode speed (bench/llm.py --llamacpp)
#   llama-quantize  F32 GGUF -> Q8_0 / Q4_0
#   llama (shared)  libllama.so, driven through the sdist's own ctypes bindings
#                   (llama_cpp/llama_cpp.py) for the tokens = eager check
# The `gguf` writer package is installed into the same interpreter (bench/llm_gguf.py).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$HERE/.venv-peers/bin/python" ]; then PYTHON="$HERE/.venv-peers/bin/python"
    else PYTHON="$ROOT/.venv/bin/python"; fi
fi
WORK="$HERE/work/llamacpp"
VERSION="${LLAMACPP_PYTHON_VERSION:-0.3.36}"
JOBS="${LLAMACPP_JOBS:-2}"
SRC="$WORK/llama_cpp_python-$VERSION"
BUILD="$WORK/build"
mkdir -p "$WORK"

"$PYTHON" -m pip install --quiet gguf cmake ninja

if [ ! -f "$WORK/llama_cpp_python-$VERSION.tar.gz" ]; then
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$WORK"
fi
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
    tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi

# absolute: CMake runs the make program from its own scratch folders (PYTHON may be relative)
BIN="$(cd "$(dirname "$PYTHON")" && pwd)"
CMAKE="cmake"; [ -x "$BIN/cmake" ] && CMAKE="$BIN/cmake"
NINJA="ninja"; [ -x "$BIN/ninja" ] && NINJA="$BIN/ninja"
if [ ! -f "$BUILD/build.ninja" ]; then
    "$CMAKE" -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON >"$WORK/configure.log"
fi
# Only the targets the benchmark uses; nice: the machine is shared.
nice -n 10 "$CMAKE" --build "$BUILD" -j "$JOBS" --target llama-bench llama-quantize llama

echo "llama.cpp (llama-cpp-python $VERSION sdist) built in $BUILD/bin:"
ls "$BUILD/bin"
