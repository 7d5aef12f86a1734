#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# clang-tidy over every translation unit under src/ with the checks of .clang-tidy; any finding
# fails (WarningsAsErrors). Needs a build tree configured with clang 14 (its compile_commands.json,
# and the clang precompiled headers built, which GCC's .gch files are not): .ci/run passes its
# sanitizer tree. Locally:
#   cmake --preset asan && cmake --build build-asan -j2
#   tools/tidy.sh build-asan
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/tidy.sh BUILD_DIR (a clang-14 tree)}
[ -f "$build/compile_commands.json" ] || { echo "tools/tidy.sh: no $build/compile_commands.json" >&2; exit 1; }
tidy=$(command -v run-clang-tidy-14 || command -v run-clang-tidy) ||
  { echo "tools/tidy.sh: needs clang-tidy 14 (apt-get install clang-tidy-14)" >&2; exit 1; }
# -quiet: only findings and the per-file command lines; run-clang-tidy exits 1 when any file fails.
"$tidy" -quiet -p "$build" -j "$(nproc)" "$PWD/src/" 2>&1 | grep -v "warnings generated\.$"
exit "${PIPESTATUS[0]}"
