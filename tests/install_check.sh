#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What `cmake --install` gives a user (ctest InstalledTree):
# 1. `protokv demo` finds the shipped recall model from any working folder: run from / with the
#    build tree's binary, and after installing into a temporary prefix (the checkout's models/
#    then out of reach);
# 2. an outside CMake project (tests/install_consumer/) builds against that prefix with
#    find_package(protokv) and runs on the recall model through the public API alone.
#   tests/install_check.sh BUILD_DIR CXX_COMPILER [CXX_FLAGS]
# CXX_FLAGS: what the consumer needs to link the installed library (the sanitizer runtimes of a
# sanitized build).
set -euo pipefail
build=$(cd "$1" && pwd)
compiler=$2
flags=${3:-}
source_dir=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
empty="$tmp/no-models"  # so that the demo does not prefer a fetched SmolLM2
mkdir -p "$empty"
demo_model() {  # the model path the demo chose (its JSON), running $1 from /
  (cd / && PROTOKV_MODELS_DIR="$empty" "$1" demo --json --quiet -t 1 --press full --budget 32 \
    --length 256) | python3 -c 'import json, sys; print(json.load(sys.stdin)["model"])'
}
from_build=$(demo_model "$build/protokv")
echo "build tree: $from_build"
case "$from_build" in */models/protokv-recall.gguf) ;; *) exit 1 ;; esac
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
from_install=$(demo_model "$tmp/prefix/bin/protokv")
echo "installed: $from_install"
[ "$from_install" = "$tmp/prefix/share/protokv/models/protokv-recall.gguf" ]

cmake -S "$source_dir/tests/install_consumer" -B "$tmp/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_CXX_COMPILER="$compiler" \
  -DCMAKE_CXX_FLAGS="$flags" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
OMP_NUM_THREADS=1 "$tmp/consumer/consumer" "$from_install"
