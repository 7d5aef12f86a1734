#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Greedy text of protokv next to llama.cpp's on the same GGUF files (issue 23: "greedy text on
# every legacy quant type equals llama.cpp's"): for each file, N tokens after PROMPT with
# `llama-completion --temp 0` and `protokv generate --temp 0 --llama-cpp-arithmetic`, both
# on one thread with an F32 KV cache; prints where the two texts first differ. llama.cpp from
# tools/llama_cpp/build.sh. FA: llama.cpp's flash attention, off by default because protokv's
# attention follows llama.cpp's other path (QK^T, softmax, V products); with FA=on (llama.cpp's
# default on a CPU) its online-softmax arithmetic differs in the last bits.
#
#   tools/llama_cpp/compare_greedy.sh MODEL.gguf [MODEL.gguf ...]
#
# Environment: PROMPT ("Once upon a time"), N (200), FA (off, on or auto), PROTOKV
# (build/protokv). stories260K in every legacy type:
#   protokv convert stories260K.bin tok512.bin --type f32 -o s.gguf
#   llama-quantize --pure s.gguf s-Q5_1.gguf Q5_1    # (its 172-wide ffn_down falls back to F16)
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [MODEL.gguf ...]" >&2; exit 1; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PROTOKV=${PROTOKV:-$ROOT/build/protokv}
BIN=${PROTOKV_CACHE:-$HOME/.cache/protokv}/llama.cpp-build/bin
PROMPT=${PROMPT:-Once upon a time}
N=${N:-200}
FA=${FA:-off}
[[ -x $BIN/llama-completion ]] || { echo "$0: run tools/llama_cpp/build.sh first" >&2; exit 1; }
[[ $N =~ ^[1-9][0-9]*$ ]] || { echo "$0: N must be a positive integer" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for model in "$@"; do
  [[ -f $model ]] || { echo "$0: $model: no such file" >&2; exit 1; }
  "$BIN/llama-completion" -m "$model" -p "$PROMPT" -n "$N" --temp 0 -ctk f32 -ctv f32 -fa "$FA" \
    -no-cnv --no-display-prompt --simple-io --ignore-eos -t 1 >"$work/llama.txt" 2>"$work/err" ||
    { tail -3 "$work/err" >&2; echo "$0: llama-completion failed on $model" >&2; exit 1; }
  # protokv prints the generated text only (no prompt).
  "$PROTOKV" generate -m "$model" -p "$PROMPT" -n "$N" --temp 0 --ignore-eos -t 1 \
    --llama-cpp-arithmetic \
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
