#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# protokv perplexity next to llama-perplexity on the same GGUF file and text (issue 9 targets:
# within 0.1% for F32/F16, 1% for quantised types). llama.cpp from tools/llama_cpp/build.sh.
#
#   tools/llama_cpp/compare_perplexity.sh MODEL.gguf TEXT.txt [CTX] [THREADS]   # CTX 512, THREADS 2
#
# llama-perplexity runs with -b CTX (one chunk per batch) and its default F16 KV cache; its log is
# written to a file because its last lines can be lost on a pipe.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 MODEL.gguf TEXT.txt [CTX] [THREADS]" >&2; exit 1; }
MODEL=$1 TEXT=$2 CTX=${3:-512} THREADS=${4:-2}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROTOKV=${PROTOKV:-$ROOT/build/protokv}
BIN=${PROTOKV_CACHE:-$HOME/.cache/protokv}/llama.cpp-build/bin
[[ -x $BIN/llama-perplexity ]] || { echo "$0: run tools/llama_cpp/build.sh first" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT

pk=$("$PROTOKV" perplexity -m "$MODEL" -f "$TEXT" -c "$CTX" -t "$THREADS" --json)
"$BIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c "$CTX" -b "$CTX" -t "$THREADS" >"$log" 2>&1
lc=$(grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' "$log") ||
  { tail -5 "$log" >&2; echo "$0: llama-perplexity printed no final estimate" >&2; exit 1; }
pk_ppl=$(jq -r .ppl <<<"$pk")
lc_ppl=$(awk '{ print $5 }' <<<"$lc")
printf 'protokv   PPL = %.4f +/- %.5f (%s chunks of %s)\n' "$pk_ppl" "$(jq -r .ppl_error <<<"$pk")" \
  "$(jq -r .chunks <<<"$pk")" "$CTX"
echo "llama.cpp ${lc#Final estimate: }"
awk -v a="$pk_ppl" -v b="$lc_ppl" 'BEGIN { d = (a - b) / b * 100; printf "difference %+.4f%%\n", d }'
