#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set-up command 2 of 2: runs the test suite of a build tree (default build/) with ctest.
#   tools/test.sh [BUILD_DIR]
# Tests that need shared/ (stories260K, tokenizer fixtures) find it beside the checkout or at
# $PROTOKV_SHARED_DIR; the real-model tests find tools/fetch_models.sh's folder. Locally a missing
# file skips its tests with a message; with CI=true a missing file fails them, and so does any
# skipped test (ctest counts a skipped test as passed, which would hide golden tests that never ran).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

shared="${PROTOKV_SHARED_DIR:-$(cd .. && pwd)/shared}"
if [ -d "$shared" ]; then export PROTOKV_SHARED_DIR="$shared"; fi
export PROTOKV_MODELS_DIR="${PROTOKV_MODELS_DIR:-${PROTOKV_CACHE:-$HOME/.cache/protokv}/models}"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$(nproc)" 2>&1 | tee "$log" ||
  status=$?
if [ "$status" != "0" ]; then exit "$status"; fi
if [ "${CI:-}" = "true" ] && grep -q "(Skipped)\|\[  SKIPPED \]" "$log"; then
  echo "tools/test.sh: some tests were skipped; under CI every test must run" >&2
  exit 1
fi
