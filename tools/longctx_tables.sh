#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Regenerates every number and figure of docs/results/longcontext_recall_model.md (the block between
# its longctx-tables markers, and docs/figures/niah_b*.svg) on a recall model:
#   tools/longctx_tables.sh [MODEL [OUTDIR]]    (default models/protokv-recall.gguf, /tmp/longctx)
# Runs `eval niah` (3 lengths x 11 depths x 2 samples) and `eval ruler` (2048 tokens, every task,
# RULER_SAMPLES samples each), every registered press at budgets 32 and 120 (1.6% and 5.9% of
# 2032 tokens), one thread, then
# tools/longctx_tables.py. Environment: PROTOKV (binary, default build/protokv), THREADS (1),
# RULER_SAMPLES (10), NIAH_SAMPLES (2), BUDGETS (32,120), README (the markdown file to edit,
# default docs/results/longcontext_recall_model.md; "-": print the block instead), LIMIT (smoke
# test: only the first N samples of each eval).
# Measured here: 113 s + 352 s wall (NIAH + RULER, -t 1, an ASan build on the other core).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
model=${1:-models/protokv-recall.gguf}
out=${2:-/tmp/longctx}
protokv=${PROTOKV:-build/protokv}
threads=${THREADS:-1}
ruler_samples=${RULER_SAMPLES:-10}
niah_samples=${NIAH_SAMPLES:-2}
budgets=${BUDGETS:-32,120}
readme=${README:-docs/results/longcontext_recall_model.md}
limit=${LIMIT:+ --limit $LIMIT}  # smoke test only: the first LIMIT samples of each eval
presses=full,streaming_llm,h2o,snapkv,pyramidkv,adakv,protokv,clusterkv,chelsea,pod

[ -x "$protokv" ] || {
  echo "longctx_tables: no protokv binary at $protokv (build it first)" >&2
  exit 1
}
[ -f "$model" ] || { echo "longctx_tables: no model file $model" >&2; exit 1; }
# Fresh folders: a samples.jsonl of an older model must never be reused.
rm -rf "$out/niah" "$out/ruler"
mkdir -p "$out"

niah_cmd="protokv eval niah -m $model --press $presses --budget $budgets --lengths 512,1024,2032 --depths 0,10,20,30,40,50,60,70,80,90,100 --samples $niah_samples -t $threads$limit --out niah"
ruler_cmd="protokv eval ruler -m $model --press $presses --budget $budgets --lengths 2048 --samples $ruler_samples -t $threads$limit --out ruler"
printf '%s\n%s\n' "$niah_cmd" "$ruler_cmd" >"$out/commands.txt"

run() {  # $1: name, rest: the command with "protokv" and "--out NAME" as written in commands.txt
  name=$1
  shift
  shift  # "protokv"
  start=$(date +%s)
  "$protokv" "$@" --quiet --out "$out/$name" >"$out/$name.txt" 2>"$out/$name.log" || {
    echo "longctx_tables: $name failed, see $out/$name.log" >&2
    exit 1
  }
  echo "$name: $(($(date +%s) - start)) s wall" >&2
}
# Word splitting of the command strings is intended (no argument contains a space).
# shellcheck disable=SC2086
run niah ${niah_cmd% --out niah}
# shellcheck disable=SC2086
run ruler ${ruler_cmd% --out ruler}

if [ "$readme" = "-" ]; then
  python3 tools/longctx_tables.py --niah "$out/niah" --ruler "$out/ruler" \
    --figures docs/figures --commands "$out/commands.txt"
else
  python3 tools/longctx_tables.py --niah "$out/niah" --ruler "$out/ruler" \
    --figures docs/figures --figures-link ../figures --commands "$out/commands.txt" --readme "$readme"
  echo "updated $readme and docs/figures/niah_b*.svg from $out" >&2
fi
