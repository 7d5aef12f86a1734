#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# protokv next to llama.cpp on the same GGUF files (issue 9, item 6; real models: issue 21,
# item 4; issue 23, item 4): prefill tokens/s at each PP length and decode tokens/s at each DEPTHS
# depth, both engines on $THREADS threads with the same KV cache type, one row per (model, cache
# type, test) with the ratio protokv / llama.cpp.
#
#   bench/vs_llama_cpp.sh [options] [PROTOKV_BINARY]      # default binary: build/protokv
#     --model PATH          a GGUF file to measure (repeatable); any architecture: an engine that
#                           cannot run it prints its error on stderr and n/a in its column
#     --models-from-cache   every model tools/fetch_models.sh fetched (SmolLM2-135M-Instruct
#                           Q4_1, Gemma 3 270M Q4_K_M); fetches them when absent
#     --random              also the random benchmark models (the default when no model is given):
#                           dim 1024, 8 layers, 16 / 4 heads, ffn 2816, vocab 32000, context 8192,
#                           in $TYPES (llama-quantize from the F16 file)
#     --markdown            Markdown tables, not fixed columns: every row (docs/results/), then the
#                           ratios alone, one line per model and cache type (the README's table)
#
# Environment: THREADS (2), PP ("512,2048"), TG (64: decode tokens per test), DEPTHS ("0,4096":
# tokens in the cache before decoding), REPS (3), TYPES ("F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K_M Q5_K_M Q6_K"),
# CACHE_TYPES ("f16": llama.cpp's default KV cache; any of f32 f16 bf16 q8_0 q4_0, both engines'
# -ctk/-ctv), LAYERS (8), PROTOKV_CACHE (~/.cache/protokv). A depth d needs d + TG tokens of
# context: depths a model's context cannot hold are left out for that model.
# Quick check that the script works (not a measurement):
#   PP=64 TG=8 DEPTHS=0,128 REPS=1 bench/vs_llama_cpp.sh --model SmolLM2-135M-Instruct.Q4_1.gguf
#
# llama.cpp: llama-bench -fa 1 (flash attention, as protokv's tiled attention) -ctk T -ctv T,
# prefill tests `-p PP -n 0`, decode tests `-p 0 -n TG -d DEPTHS`; tokens/s = its mean over -r REPS.
# protokv: `bench e2e -c 1,PP,DEPTHS -n TG --reps REPS -ctk T -ctv T` (median over reps); prefill tokens/s of
# context PP; decode tokens/s = 1000 / decode ms per token after a prompt of DEPTH tokens (depth
# 0: a 1-token prompt, as llama-bench's tg starts from an empty cache and protokv needs a token).
# Builds llama.cpp with tools/llama_cpp/build.sh when needed. Take timings on an idle machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
THREADS=${THREADS:-2}
TYPES=${TYPES:-"F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K_M Q5_K_M Q6_K"}
CACHE_TYPES=${CACHE_TYPES:-f16}
PP=${PP:-512,2048}
TG=${TG:-64}
DEPTHS=${DEPTHS:-0,4096}
REPS=${REPS:-3}
LAYERS=${LAYERS:-8}
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
MODELS=$CACHE/bench-models

die() { echo "vs_llama_cpp.sh: $*" >&2; exit 1; }

PROTOKV=$ROOT/build/protokv
files=()
random=0
from_cache=0
markdown=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --model)
      [[ $# -ge 2 ]] || die "--model needs a path"
      [[ -f $2 ]] || die "--model $2: no such file"
      files+=("$2")
      shift 2 ;;
    --models-from-cache) from_cache=1; shift ;;
    --random) random=1; shift ;;
    --markdown) markdown=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) PROTOKV=$1; shift ;;
  esac
done
[[ $PP =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "PP must be comma-separated positive numbers, got '$PP'"
[[ $DEPTHS =~ ^[0-9]+(,[0-9]+)*$ ]] || die "DEPTHS must be comma-separated numbers, got '$DEPTHS'"
IFS=, read -ra pp_list <<<"$PP"
IFS=, read -ra depth_list_all <<<"$DEPTHS"
[[ $TG =~ ^[1-9][0-9]*$ && $REPS =~ ^[1-9][0-9]*$ && $THREADS =~ ^[1-9][0-9]*$ ]] ||
  die "TG, REPS and THREADS must be positive integers"
for c in $CACHE_TYPES; do
  [[ $c =~ ^(f32|f16|bf16|q8_0|q4_0)$ ]] || die "CACHE_TYPES: '$c' is not one of f32 f16 bf16 q8_0 q4_0"
done
command -v jq >/dev/null || die "needs jq"
[[ -x $PROTOKV ]] || die "no protokv binary at $PROTOKV"
if [[ $from_cache == 1 ]]; then
  mapfile -t fetched < <("$ROOT/tools/fetch_models.sh" --quiet)
  files+=("${fetched[@]}")
fi
[[ ${#files[@]} -gt 0 ]] || random=1

# protokv picks OpenBLAS's kernels for this CPU itself (src/kernels/blas_core.h: it starts again
# with OPENBLAS_CORETYPE set when OpenBLAS fell back to narrower ones); the core it ran is printed
# below. llama.cpp is built without BLAS.
BIN=$("$ROOT/tools/llama_cpp/build.sh")/bin
mkdir -p "$MODELS"
err=$(mktemp)
trap 'rm -f "$err"' EXIT

if [[ $random == 1 ]]; then
  base=$MODELS/bench-d1024-l$LAYERS-c8192
  if [[ ! -f $base-F16.gguf ]]; then
    "$PROTOKV" make-model --dim 1024 --layers "$LAYERS" --heads 16 --kv-heads 4 --ffn 2816 \
      --vocab 32000 --ctx 8192 --type f16 --seed 1 --name protokv-bench -o "$base-F16.gguf" >&2
  fi
  for type in $TYPES; do
    file=$base-$type.gguf
    if [[ ! -f $file ]]; then
      "$BIN/llama-quantize" "$base-F16.gguf" "$file" "$type" "$THREADS" >/dev/null 2>&1 ||
        die "llama-quantize to $type failed"
    fi
    files+=("$file")
  done
fi

# The model's context from its GGUF metadata as protokv reads it; empty when protokv cannot load
# the file (an architecture it does not run yet): then every depth is tried.
context_of() {
  "$PROTOKV" info -m "$1" --json 2>/dev/null | jq -r '.context_length // empty' 2>/dev/null || true
}

# "1234.5" or "n/a"; ratio "1.23" or empty.
fmt_ts() { if [[ -n $1 ]]; then printf '%.1f' "$1"; else printf 'n/a'; fi; }
ratio() { if [[ -n $1 && -n $2 ]]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; fi; }
# A ratio below 1 is bold in Markdown: a target missed.
bold_miss() {
  if [[ -n $1 ]] && awk -v x="$1" 'BEGIN { exit !(x < 1) }'; then echo "**$1**"; else echo "${1:-n/a}"; fi
}
summary=()  # Markdown mode: "| model | KV | ratio | ratio ..." per model and cache type
row() {
  if [[ $markdown == 1 ]]; then
    printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$5" "$(bold_miss "$6")"
  else
    printf '%-34s %-6s %-12s %12s %12s %10s\n' "$@"
  fi
}

echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset (protokv picks)} | threads $THREADS | reps $REPS | llama.cpp $(git -C "$CACHE/llama.cpp-src" log -1 --format=%h) | $(nproc) cores | load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "tokens/s; ppN: prefill of N tokens; tgN@dD: N decode tokens after D tokens in the cache; KV: both engines' cache type; ratio: protokv / llama.cpp (above 1: protokv faster)"
[[ $markdown == 1 ]] && echo
row model KV test llama.cpp protokv ratio
[[ $markdown == 1 ]] && echo "| --- | --- | --- | --- | --- | --- |"
for file in "${files[@]}"; do
  name=$(basename "$file" .gguf)
  ctx=$(context_of "$file")
  depths=()
  for d in "${depth_list_all[@]}"; do
    if [[ -z $ctx ]] || ((d + TG <= ctx)); then depths+=("$d"); fi
  done
  depth_list=$(IFS=,; echo "${depths[*]}")

  for kv in $CACHE_TYPES; do
    # llama.cpp: prefill and decode as separate runs, so the prefill tests do not repeat per depth.
    lb_pp=$("$BIN/llama-bench" -m "$file" -p "$PP" -n 0 -fa 1 -ctk "$kv" -ctv "$kv" -t "$THREADS" \
      -r "$REPS" -o json 2>"$err") || { echo "$name: llama-bench failed: $(tail -1 "$err")" >&2; lb_pp='[]'; }
    lb_tg='[]'
    if [[ -n $depth_list ]]; then
      lb_tg=$("$BIN/llama-bench" -m "$file" -p 0 -n "$TG" -d "$depth_list" -fa 1 -ctk "$kv" -ctv "$kv" \
        -t "$THREADS" -r "$REPS" -o json 2>"$err") ||
        { echo "$name: llama-bench failed: $(tail -1 "$err")" >&2; lb_tg='[]'; }
    fi

    # protokv: one bench e2e run over every context (depth 0 is a 1-token prompt).
    contexts=$(printf '%s\n' 1 "${pp_list[@]}" "${depths[@]}" | grep -vx 0 | sort -nu | paste -sd,)
    pk='{"results": []}'
    if ! pk=$("$PROTOKV" bench e2e -m "$file" -c "$contexts" -n "$TG" --reps "$REPS" -t "$THREADS" \
      -ctk "$kv" -ctv "$kv" --json 2>"$err"); then
      echo "$name: protokv bench e2e failed: $(grep -m1 'error' "$err" || tail -1 "$err")" >&2
      pk='{"results": []}'
    fi

    line="| $name | $kv"
    for p in "${pp_list[@]}"; do
      a=$(jq -r --argjson n "$p" '.[] | select(.n_prompt == $n and .n_gen == 0) | .avg_ts' <<<"$lb_pp")
      b=$(jq -r --argjson n "$p" '.results[] | select(.context == $n) | .prefill_tokens_per_s' <<<"$pk")
      row "$name" "$kv" "pp$p" "$(fmt_ts "$a")" "$(fmt_ts "$b")" "$(ratio "$b" "$a")"
      line+=" | $(bold_miss "$(ratio "$b" "$a")")"
    done
    for d in "${depth_list_all[@]}"; do
      if [[ " ${depths[*]} " != *" $d "* ]]; then line+=" | -"; continue; fi
      a=$(jq -r --argjson d "$d" --argjson n "$TG" \
        '.[] | select(.n_depth == $d and .n_gen == $n and .n_prompt == 0) | .avg_ts' <<<"$lb_tg")
      b=$(jq -r --argjson c "$((d > 0 ? d : 1))" \
        '.results[] | select(.context == $c and .decode_ms_per_token > 0) | 1000 / .decode_ms_per_token' <<<"$pk")
      row "$name" "$kv" "tg$TG@d$d" "$(fmt_ts "$a")" "$(fmt_ts "$b")" "$(ratio "$b" "$a")"
      line+=" | $(bold_miss "$(ratio "$b" "$a")")"
    done
    summary+=("$line |")
  done
  echo "$name: protokv ran OpenBLAS's $(jq -r '.config.blas_core // "?"' <<<"$pk") kernels" >&2
  for d in "${depth_list_all[@]}"; do
    [[ " ${depths[*]} " == *" $d "* ]] ||
      echo "$name: depth $d left out: $d + $TG tokens exceed its context of $ctx" >&2
  done
done

if [[ $markdown == 1 ]]; then
  # The ratios alone (protokv / llama.cpp tokens/s; "-": a depth beyond the model's context).
  header="| model | KV"
  rule="| --- | ---"
  for p in "${pp_list[@]}"; do header+=" | pp$p"; rule+=" | ---"; done
  for d in "${depth_list_all[@]}"; do header+=" | tg$TG@d$d"; rule+=" | ---"; done
  printf '\n%s |\n%s |\n' "$header" "$rule"
  printf '%s\n' "${summary[@]}"
fi
