#!/usr/bin/env bash
# The fidelity and long-context evaluations on the real pretrained models (issue 21), with the
# exact commands behind docs/results/*.md. Each writes its results folder (results.json,
# config.json, SVGs; samples.jsonl for the long-context ones) under OUT and copies the JSON into
# docs/results/data/. Not part of CI: hours on a 2-core machine (each command prints its own
# progress when run on a terminal).
#
#   tools/real_model_evals.sh [fidelity|niah|niah-gemma|ruler] [OUT]   # default: all, /tmp/protokv-evals
#
# Text the models did not write: Debian's licence texts (base-files, present on every Debian
# machine), concatenated; NIAH uses it as its haystack.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PROTOKV=${PROTOKV:-$ROOT/build/protokv}
WHAT=${1:-all}
OUT=${2:-/tmp/protokv-evals}
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
THREADS=${THREADS:-2}
PRESSES=full,streaming_llm,h2o,snapkv,pyramidkv,adakv,clusterkv,chelsea,pod,protokv

[[ -x $PROTOKV ]] || { echo "real_model_evals.sh: no protokv binary at $PROTOKV" >&2; exit 1; }
mapfile -t models < <("$HERE/fetch_models.sh" --quiet)
SMOLLM2=${models[0]}
GEMMA3=${models[1]}

TEXT=$CACHE/text/debian-licences.txt
mkdir -p "$(dirname "$TEXT")" "$OUT" "$ROOT/docs/results/data"
if [[ ! -s $TEXT ]]; then
  (cd /usr/share/common-licenses &&
    cat GPL-3 GPL-2 LGPL-2.1 GFDL-1.3 Apache-2.0 MPL-2.0 Artistic CC0-1.0) >"$TEXT"
fi

run() { # name, then the protokv arguments
  local name=$1
  shift
  echo "real_model_evals.sh: $name: protokv $*" >&2
  "$PROTOKV" "$@" --out "$OUT/$name" --json >"$OUT/$name.json"
  cp "$OUT/$name.json" "$ROOT/docs/results/data/$name.json"
}

if [[ $WHAT == all || $WHAT == fidelity ]]; then
  # 16 prompts of 2048 tokens, each teacher-forced over the next 64 tokens of the text.
  run fidelity_smollm2 eval fidelity -m "$SMOLLM2" -f "$TEXT" --prompt-len 2048 --continuation 64 \
    --samples "${SAMPLES:-16}" --press "$PRESSES" --budget 64,128,256,512 -t "$THREADS" \
    --share-prefill
fi
if [[ $WHAT == all || $WHAT == niah ]]; then
  run niah_smollm2 eval niah -m "$SMOLLM2" --haystack "$TEXT" --press "$PRESSES" --budget 64,256 \
    --lengths 1024,2048,4096,7936 --depths 0,25,50,75,100 -t "$THREADS" --share-prefill
fi
if [[ $WHAT == all || $WHAT == niah-gemma ]]; then
  run niah_gemma3 eval niah -m "$GEMMA3" --haystack "$TEXT" --press "$PRESSES" --budget 64,256 \
    --lengths 4096,16384,32000 --depths 0,50,100 -t "$THREADS" --share-prefill
fi
if [[ $WHAT == all || $WHAT == ruler ]]; then
  for mode in query-aware query-agnostic; do
    run "ruler_smollm2_$mode" eval ruler -m "$SMOLLM2" --press "$PRESSES" --budget 64,256 \
      --lengths 4096 --samples 20 --haystack "$TEXT" --mode "$mode" -t "$THREADS" --share-prefill
  done
fi
