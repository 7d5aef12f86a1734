#!/usr/bin/env bash
# protokv next to llama.cpp on the same GGUF files (issue 9, item 6): the benchmark model
# (dim 1024, 8 layers, 16 / 4 heads, ffn 2816, vocab 32000, random weights) in F16, Q8_0 and
# Q4_K_M (llama-quantize from the F16 file), llama-bench pp512 / pp2048 / tg64 against
# `protokv bench e2e` prefill at 512 / 2048 and decode from an empty context, both on $THREADS threads.
#
#   bench/vs_llama_cpp.sh [PROTOKV_BINARY]      # default: build/protokv
#
# Environment: THREADS (2), TYPES ("F16 Q8_0 Q4_K_M"), PP ("512,2048"), TG (64), REPS (3),
# LAYERS (8; fewer for a quick check of the script), PROTOKV_CACHE (~/.cache/protokv).
# Builds llama.cpp with tools/llama_cpp/build.sh when needed. Take timings on an idle machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROTOKV=${1:-$ROOT/build/protokv}
THREADS=${THREADS:-2}
TYPES=${TYPES:-"F16 Q8_0 Q4_K_M"}
PP=${PP:-512,2048}
TG=${TG:-64}
REPS=${REPS:-3}
LAYERS=${LAYERS:-8}
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
MODELS=$CACHE/bench-models
# Debian's OpenBLAS 0.3.21 (DYNAMIC_ARCH) does not recognise CPUs reported without a model (e.g.
# "Intel(R) Xeon(R) Processor" on this VM) and falls back to its SSE3 Prescott kernels: sgemm at
# ~20 GFLOP/s per core instead of ~110. Name the core from the CPU flags unless the caller did.
if [[ -z ${OPENBLAS_CORETYPE:-} ]]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
command -v jq >/dev/null || { echo "vs_llama_cpp.sh: needs jq" >&2; exit 1; }
[[ -x $PROTOKV ]] || { echo "vs_llama_cpp.sh: no protokv binary at $PROTOKV" >&2; exit 1; }

BIN=$("$ROOT/tools/llama_cpp/build.sh")/bin
mkdir -p "$MODELS"
base=$MODELS/bench-d1024-l$LAYERS
if [[ ! -f $base-F16.gguf ]]; then
  "$PROTOKV" make-model --dim 1024 --layers "$LAYERS" --heads 16 --kv-heads 4 --ffn 2816 \
    --vocab 32000 --ctx 4096 --type f16 --seed 1 --name protokv-bench -o "$base-F16.gguf" >&2
fi

echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} | threads $THREADS | llama.cpp $(git -C "$CACHE/llama.cpp-src" log -1 --format=%h) | $(nproc) cores | load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-9s %12s %12s %12s\n' type engine "pp${PP%%,*}" "pp${PP##*,}" "tg$TG"
for type in $TYPES; do
  file=$base-$type.gguf
  if [[ ! -f $file ]]; then
    "$BIN/llama-quantize" "$base-F16.gguf" "$file" "$type" "$THREADS" >/dev/null 2>&1
  fi
  # llama-bench: mean tokens/s over -r repetitions per test (its default flash-attention setting).
  lb=$("$BIN/llama-bench" -m "$file" -p "$PP" -n "$TG" -t "$THREADS" -r "$REPS" -o json 2>/dev/null)
  lb_pp() { jq -r --argjson n "$1" '.[] | select(.n_prompt == $n and .n_gen == 0) | .avg_ts' <<<"$lb"; }
  lb_tg=$(jq -r --argjson n "$TG" '.[] | select(.n_prompt == 0 and .n_gen == $n) | .avg_ts' <<<"$lb")
  printf '%-8s %-9s %12.1f %12.1f %12.1f\n' "$type" llama.cpp "$(lb_pp "${PP%%,*}")" \
    "$(lb_pp "${PP##*,}")" "$lb_tg"
  # protokv bench e2e: median over --reps; decode measured after a 1-token prompt, like tg.
  if pk=$("$PROTOKV" bench e2e -m "$file" -c "1,$PP" -n "$TG" --reps "$REPS" -t "$THREADS" \
    --json 2>"$MODELS/protokv.err"); then
    pk_pp() { jq -r --argjson n "$1" '.results[] | select(.context == $n) | .prefill_tokens_per_s' <<<"$pk"; }
    pk_tg=$(jq -r '.results[] | select(.context == 1) | 1000 / .decode_ms_per_token' <<<"$pk")
    printf '%-8s %-9s %12.1f %12.1f %12.1f\n' "$type" protokv "$(pk_pp "${PP%%,*}")" \
      "$(pk_pp "${PP##*,}")" "$pk_tg"
  else
    printf '%-8s %-9s %s\n' "$type" protokv "$(head -1 "$MODELS/protokv.err")"
  fi
done
