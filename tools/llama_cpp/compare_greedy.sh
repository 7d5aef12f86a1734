#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Greedy text of protokv next to llama.cpp's on the same GGUF files (issue 23: "greedy text on
# every legacy quant type equals llama.cpp's"): for each file, N tokens after PROMPT with
# `llama-completion --temp 0` and `protokv generate --temp 0 --llama-cpp-arithmetic`, with the
# same flash-attention mode, KV cache type and llama.cpp thread count; prints where the two texts
# first differ. llama.cpp from tools/llama_cpp/build.sh. The defaults are llama.cpp's own on a
# CPU (flash attention on, an f16 cache), but one thread.
#
#   tools/llama_cpp/compare_greedy.sh MODEL.gguf [MODEL.gguf ...]
#   FA=off CACHE=f32 tools/llama_cpp/compare_greedy.sh MODEL.gguf   # llama.cpp's other path
#
# Environment: PROMPT ("Once upon a time"), N (200), FA (on or off: llama.cpp's -fa, protokv's
# --llama-cpp-flash-attn), CACHE (f16 or f32: -ctk/-ctv and --cache-type-k/v; with FA=off and
# f16 protokv keeps its own attention arithmetic: llama.cpp's F16 QK^T path is not followed),
# THREADS (1: llama.cpp's -t, and protokv's --llama-cpp-threads with FA=on; llama.cpp's flash
# attention splits a decode step over its threads from 512 cells on), PROTOKV (build/protokv).
# stories260K in every legacy type:
#   protokv convert stories260K.bin tok512.bin --type f32 -o s.gguf
#   llama-quantize --pure s.gguf s-Q5_1.gguf Q5_1    # (its 172-wide ffn_down falls back to F16)
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [MODEL.gguf ...]" >&2; exit 1; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROTOKV=${PROTOKV:-$ROOT/build/protokv}
BIN=${PROTOKV_CACHE:-$HOME/.cache/protokv}/llama.cpp-build/bin
PROMPT=${PROMPT:-Once upon a time}
N=${N:-200}
FA=${FA:-on}
CACHE=${CACHE:-f16}
[[ $FA == on || $FA == off ]] || { echo "$0: FA must be on or off" >&2; exit 1; }
[[ $CACHE == f32 || $CACHE == f16 ]] || { echo "$0: CACHE must be f32 or f16" >&2; exit 1; }
THREADS=${THREADS:-1}
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || { echo "$0: THREADS must be a positive integer" >&2; exit 1; }
fa_flag=()
[[ $FA == on ]] && fa_flag=(--llama-cpp-flash-attn --llama-cpp-threads "$THREADS")
[[ -x $BIN/llama-completion ]] || { echo "$0: run tools/llama_cpp/build.sh first" >&2; exit 1; }
[[ $N =~ ^[1-9][0-9]*$ ]] || { echo "$0: N must be a positive integer" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for model in "$@"; do
  [[ -f $model ]] || { echo "$0: $model: no such file" >&2; exit 1; }
  "$BIN/llama-completion" -m "$model" -p "$PROMPT" -n "$N" --temp 0 -ctk "$CACHE" -ctv "$CACHE" -fa "$FA" \
    -no-cnv --no-display-prompt --simple-io --ignore-eos -t "$THREADS" >"$work/llama.txt" 2>"$work/err" ||
    { tail -3 "$work/err" >&2; echo "$0: llama-completion failed on $model" >&2; exit 1; }
  # protokv prints the generated text only (no prompt).
  "$PROTOKV" generate -m "$model" -p "$PROMPT" -n "$N" --temp 0 --ignore-eos -t 1 \
    --llama-cpp-arithmetic ${fa_flag[@]+"${fa_flag[@]}"} --cache-type-k "$CACHE" --cache-type-v "$CACHE" \
    >"$work/protokv.txt" 2>"$work/err" ||
    { tail -3 "$work/err" >&2; echo "$0: protokv generate failed on $model" >&2; exit 1; }
  python3 - "$model" "$work/llama.txt" "$work/protokv.txt" <<'EOF'
import sys
model, llama_path, protokv_path = sys.argv[1:]
llama = open(llama_path, encoding="utf-8", errors="replace").read().strip()
ours = open(protokv_path, encoding="utf-8", errors="replace").read().strip()
same = 0
while same < min(len(llama), len(ours)) and llama[same] == ours[same]:
    same += 1
if llama == ours:
    print(f"{model}: identical ({len(llama)} characters)")
else:
    print(f"{model}: identical for {same} of {len(llama)} characters, then "
          f"{llama[same:same + 24]!r} (llama.cpp) vs {ours[same:same + 24]!r} (protokv)")
EOF
done
