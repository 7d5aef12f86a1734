#!/usr/bin/env bash
# Regenerates the llama.cpp oracle fixtures of tests/test_llama_cpp_oracle.cpp:
# for each architecture x weight type, a tiny random-weight GGUF (protokv make-model, then
# llama-quantize --pure for every type but F32) and llama.cpp's teacher-forced logits for a fixed
# token sequence (protokv-dump-logits), in tests/data/llama_cpp/<arch>_<type>.{gguf,logits}, plus
# manifest.tsv (file sizes, checksums, llama.cpp commit, and act_rounding: the max |logit
# difference| between llama.cpp on the file and llama.cpp on the file dequantised to F32 with
# llama-quantize --allow-requantize. That is the part of llama.cpp's result due to its rounding of
# activations (F16/BF16/Q8 in its mat-muls), i.e. what an engine computing in F32 on the same
# weights should differ by: the starting point of the test's per-type tolerance).
#
#   tools/llama_cpp/make_fixtures.sh [PROTOKV_BINARY]   # default: build/protokv
#
# Needs the llama.cpp of tools/llama_cpp/build.sh (run first; not part of CI). Re-run after merging
# new architectures or types: rows whose prerequisites are missing print "skipped: ..." and leave
# their old files alone. Deterministic for a given protokv and llama.cpp.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PROTOKV=${1:-$ROOT/build/protokv}
OUT=$ROOT/tests/data/llama_cpp
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
BIN=$CACHE/llama.cpp-build/bin
[[ -x $PROTOKV ]] || { echo "make_fixtures.sh: no protokv binary at $PROTOKV" >&2; exit 1; }
for tool in llama-quantize protokv-dump-logits; do
  [[ -x $BIN/$tool ]] || { echo "make_fixtures.sh: $BIN/$tool missing: run tools/llama_cpp/build.sh" >&2; exit 1; }
done

ALL_ARCHS=(llama qwen2 qwen3 gemma3)
read -r -a ARCHS <<<"${ONLY_ARCHS:-${ALL_ARCHS[*]}}"  # ONLY_ARCHS="a b": regenerate those only
TYPES=(F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K)
# gemma3: the types of the real Gemma 3 270M Q4_K_M file (F32 norms, Q8_0 embedding, Q5_0, Q4_K,
# Q6_K matrices) plus F32; a window of 8 tokens on every other layer (layer 0 local, layer 1
# global), so the 32-token sequence crosses the window 24 times.
GEMMA3_TYPES=(F32 Q8_0 Q5_0 Q4_K Q6_K)
GEMMA3_FLAGS=(--sliding-window 8 --swa-period 2 --tied)

# Shape: every matrix row is 256 long (dim = ffn = 256), so the K-quants (256-value super-blocks)
# apply to every tensor and llama-quantize never falls back to another type. 4 query heads share
# one KV head (GQA, head_dim 64). F32 has one layer so that its file stays under 2 MB; the other
# types have two. Vocabulary 260: the synthetic byte vocabulary plus one piece.
DIM=256 FFN=256 HEADS=4 KV_HEADS=1 VOCAB=260 CTX=64 SEED=9
# Also as llama-completion evaluates them (<arch>_<type>.completion.logits) for these.
COMPLETION_ARCHS=(llama qwen3) COMPLETION_TYPES=(F32 F16 Q8_0 Q4_1) PROMPT_TOKENS=5
# The token sequence: BOS, then 31 ids from a fixed linear congruential generator; FA_TOKENS goes
# on to 64 (the context), a batch long enough for llama.cpp's tiled flash attention.
FA_TOKENS=(1)
state=12345
while ((${#FA_TOKENS[@]} < CTX)); do
  state=$(((state * 1103515245 + 12345) % 2147483648))
  FA_TOKENS+=($((3 + state / 65536 % (VOCAB - 3))))
done
TOKENS=("${FA_TOKENS[@]:0:32}")

has_arch_flag=0
"$PROTOKV" make-model --help 2>/dev/null | grep -q -- '--arch' && has_arch_flag=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$OUT"
commit=$(git -C "$CACHE/llama.cpp-src" log -1 --format=%h 2>/dev/null || echo unknown)

for arch in "${ARCHS[@]}"; do
  arch_flags=()
  if [[ $arch != llama ]]; then
    if [[ $has_arch_flag == 0 ]]; then
      echo "$arch: skipped: make-model has no --arch"
      continue
    fi
  fi
  [[ $has_arch_flag == 1 ]] && arch_flags=(--arch "$arch")
  arch_types=("${TYPES[@]}")
  if [[ $arch == gemma3 ]]; then
    arch_flags+=("${GEMMA3_FLAGS[@]}")
    arch_types=("${GEMMA3_TYPES[@]}")
  fi
  for layers in 1 2; do
    "$PROTOKV" make-model "${arch_flags[@]}" --dim $DIM --ffn $FFN --layers $layers --heads $HEADS \
      --kv-heads $KV_HEADS --vocab $VOCAB --ctx $CTX --type f32 --seed $SEED -t 1 \
      --name "protokv-oracle-$arch" -o "$tmp/${arch}_${layers}.gguf" >/dev/null
  done
  for type in "${arch_types[@]}"; do
    gguf=$OUT/${arch}_${type}.gguf
    if [[ $type == F32 ]]; then
      cp "$tmp/${arch}_1.gguf" "$gguf"
    else
      "$BIN/llama-quantize" --pure "$tmp/${arch}_2.gguf" "$gguf" "$type" 1 >"$tmp/quantize.log" 2>&1 ||
        { cat "$tmp/quantize.log" >&2; exit 1; }
    fi
    "$BIN/protokv-dump-logits" "$gguf" "$OUT/${arch}_${type}.logits" "${TOKENS[@]}"
    # As llama-completion runs: a prompt batch of PROMPT_TOKENS, its last row's logits only, then
    # one token per llama_decode (the llama.cpp-arithmetic test).
    if [[ " ${COMPLETION_ARCHS[*]} " == *" $arch "* && " ${COMPLETION_TYPES[*]} " == *" $type "* ]]; then
      "$BIN/protokv-dump-logits" --prompt $PROMPT_TOKENS --last-prompt-logits "$gguf" \
        "$OUT/${arch}_${type}.completion.logits" "${TOKENS[@]}"
      # With llama.cpp's flash attention (-fa on, which reads the F32 cache's K/V as F16): the
      # same run (ggml's one-chunk path), and all 64 FA_TOKENS in one batch (its tiled path).
      "$BIN/protokv-dump-logits" --flash-attn --prompt $PROMPT_TOKENS --last-prompt-logits "$gguf" \
        "$OUT/${arch}_${type}.fa_completion.logits" "${TOKENS[@]}"
      "$BIN/protokv-dump-logits" --flash-attn "$gguf" "$OUT/${arch}_${type}.fa_batch.logits" \
        "${FA_TOKENS[@]}"
    fi
    act_rounding=0
    if [[ $type != F32 ]]; then
      "$BIN/llama-quantize" --allow-requantize "$gguf" "$tmp/dequantised.gguf" F32 1 >"$tmp/quantize.log" 2>&1 ||
        { cat "$tmp/quantize.log" >&2; exit 1; }
      "$BIN/protokv-dump-logits" "$tmp/dequantised.gguf" "$tmp/dequantised.logits" "${TOKENS[@]}"
      act_rounding=$("$BIN/protokv-dump-logits" --max-diff "$OUT/${arch}_${type}.logits" "$tmp/dequantised.logits")
    fi
    echo "$act_rounding" >"$tmp/${arch}_${type}.act"
    bytes=$(stat -c %s "$gguf")
    ((bytes <= 2 * 1024 * 1024)) || { echo "make_fixtures.sh: $gguf is $bytes bytes (> 2 MiB)" >&2; exit 1; }
    echo "$arch $type: $bytes bytes, act_rounding $act_rounding"
  done
done

# The manifest lists what is on disk (rows from earlier runs included).
{
  printf 'arch\ttype\tgguf_bytes\tact_rounding\tgguf_sha256\tlogits_sha256\tllama_cpp\n'
  for arch in "${ALL_ARCHS[@]}"; do
    for type in "${TYPES[@]}"; do
      gguf=$OUT/${arch}_${type}.gguf
      [[ -f $gguf ]] || continue
      act=$(cat "$tmp/${arch}_${type}.act" 2>/dev/null ||
        awk -v a="$arch" -v t="$type" '$1 == a && $2 == t { print $4 }' "$OUT/manifest.tsv" 2>/dev/null)
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$arch" "$type" "$(stat -c %s "$gguf")" "${act:-?}" \
        "$(sha256sum "$gguf" | cut -c1-16)" "$(sha256sum "$OUT/${arch}_${type}.logits" | cut -c1-16)" "$commit"
    done
  done
} >"$tmp/manifest.tsv"
mv "$tmp/manifest.tsv" "$OUT/manifest.tsv"
echo "wrote $OUT/manifest.tsv"
