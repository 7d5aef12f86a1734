#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the libFuzzer targets of a fuzz build (cmake -DPROTOKV_FUZZ=ON with clang; .ci/run shows
# how) for SECONDS each, one after the other, on their seed corpus (protokv_fuzz_seeds) plus the
# committed regression cases, and prints one line per target: executions, coverage (edges),
# features, corpus size, result.
#   fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
# Fails (exit 1) when any target finds a crash, a sanitizer report, a leak, an input slower than
# 1 s or an allocation over 512 MB; the input is saved under $PROTOKV_FUZZ_ARTIFACTS (default
# ./fuzz-artifacts) and its reproduction command printed. Corpora grow in $PROTOKV_FUZZ_CORPUS
# when set (kept between runs), else in a temporary folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
seconds=$2
shift 2
fuzzer="$build/fuzz/protokv_fuzz"
seeder="$build/fuzz/protokv_fuzz_seeds"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then mapfile -t targets < <("$seeder" --list); fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
artifacts=${PROTOKV_FUZZ_ARTIFACTS:-$PWD/fuzz-artifacts}
mkdir -p "$artifacts"
"$seeder" "$work/seeds" "${targets[@]}"

failed=()
for target in "${targets[@]}"; do
  corpus=${PROTOKV_FUZZ_CORPUS:+$PROTOKV_FUZZ_CORPUS/$target}
  corpus=${corpus:-$work/corpus/$target}
  mkdir -p "$corpus" "$root/fuzz/regressions/$target"
  dict=()
  if [ -f "$root/fuzz/dict/$target.dict" ]; then dict=(-dict="$root/fuzz/dict/$target.dict"); fi
  log="$work/$target.log"
  status=0
  PROTOKV_FUZZ_TARGET=$target "$fuzzer" -max_total_time="$seconds" -timeout=1 \
    -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$target-" "${dict[@]}" \
    "$corpus" "$work/seeds/$target" "$root/fuzz/regressions/$target" > "$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<< "$last")
  if [ "$status" = 0 ]; then result=ok; else result="FINDING (exit $status)"; failed+=("$target"); fi
  printf '%-14s %6ss  execs %-9s cov %-6s ft %-6s corpus %-12s %s\n' "$target" "$seconds" \
    "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
  if [ "$status" != 0 ]; then
    grep -E 'ERROR|SUMMARY|==[0-9]+==|fuzz:|runtime error|Test unit written' "$log" | head -20 >&2 || true
    echo "  reproduce: PROTOKV_FUZZ_TARGET=$target $fuzzer $artifacts/$target-*" >&2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz/run.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
