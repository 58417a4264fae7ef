#!/usr/bin/env bash
# llama.cpp's `llama-server`, built from the llama.cpp sources inside the llama-cpp-python source
# package on PyPI, for `python -m profiler serve-live --engine llama.cpp` (docs/live.md, "Real
# engines"). Usage: scripts/build-llama-server.sh [PREFIX]  (default .llama-server; the binary is
# PREFIX/bin/llama-server). Needs cmake, ninja and a C++ compiler (Debian: cmake ninja-build g++).
#
# One static binary (no shared ggml/llama libraries to find at run time), built for this CPU
# (llama.cpp's default GGML_NATIVE), without the web UI, OpenSSL or tests. About 5 minutes on 2 cores.
set -euo pipefail
PREFIX=${1:-.llama-server}
VERSION=0.3.36
if [[ -x "$PREFIX/bin/llama-server" ]]; then
    "$PREFIX/bin/llama-server" --version 2>&1 | head -1
    exit 0
fi
for tool in cmake ninja c++; do
    command -v "$tool" >/dev/null || { echo "build-llama-server: $tool is missing (Debian: apt-get install cmake ninja-build g++)" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work" 2>/dev/null
tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$work/build" --target llama-server >/dev/null
mkdir -p "$PREFIX/bin"
cp "$work/build/bin/llama-server" "$PREFIX/bin/llama-server.tmp"
mv "$PREFIX/bin/llama-server.tmp" "$PREFIX/bin/llama-server"
echo "llama-cpp-python $VERSION" > "$PREFIX/SOURCE"
"$PREFIX/bin/llama-server" --version 2>&1 | head -1
