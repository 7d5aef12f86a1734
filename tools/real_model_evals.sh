#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The fidelity and long-context evaluations on the real pretrained models (issue 21), with the
# exact commands behind docs/results/*.md. Each keeps its results folder (results.json,
# config.json, SVGs, samples.jsonl) in docs/results/NAME/.
# Not part of CI: hours on a 2-core machine, so every run resumes where the last one stopped
# (each command prints its own progress when run on a terminal).
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
mkdir -p "$(dirname "$TEXT")" "$OUT"
if [[ ! -s $TEXT ]]; then
  (cd /usr/share/common-licenses &&
    cat GPL-3 GPL-2 LGPL-2.1 GFDL-1.3 Apache-2.0 MPL-2.0 Artistic CC0-1.0) >"$TEXT"
fi

# Every evaluation resumes: its results folder lives in docs/results/NAME/ (samples.jsonl holds
# each finished record, committed as it grows), is copied to OUT/NAME, run there with --resume,
# and copied back whether the run finishes or is stopped (Ctrl-C, kill), so a grid of hours
# accumulates across sessions. results.json there is what --json prints.
run() { # name, the folder the command writes under --out ("." for the out folder itself), args
  local name=$1 sub=$2
  shift 2
  local keep=$ROOT/docs/results/$name made=$OUT/$name/$sub
  mkdir -p "$made"
  if [[ -s $keep/samples.jsonl && ! -s $made/samples.jsonl ]]; then
    cp "$keep/samples.jsonl" "$made/samples.jsonl"
  fi
  echo "real_model_evals.sh: $name: protokv $*" >&2
  trap 'mkdir -p "$keep"; cp "$made/samples.jsonl" "$keep/samples.jsonl"; exit 130' INT TERM
  local status=0
  "$PROTOKV" "$@" --out "$OUT/$name" --resume --json >"$OUT/$name.json" || status=$?
  trap - INT TERM
  mkdir -p "$keep"
  if [[ -s $made/samples.jsonl ]]; then cp "$made/samples.jsonl" "$keep/samples.jsonl"; fi
  [[ $status == 0 ]] || return "$status"
  cp "$made"/*.json "$made"/*.svg "$keep/" 2>/dev/null || true
}

if [[ $WHAT == all || $WHAT == fidelity ]]; then
  # SAMPLES prompts of 2048 tokens, each teacher-forced over the next 64 tokens of the text.
  # eval fidelity writes into a subfolder named after the model and its shape.
  samples=${SAMPLES:-48}
  run fidelity_smollm2 "fidelity_$(basename "$SMOLLM2" .gguf)_p2048_c64_s$samples" \
    eval fidelity -m "$SMOLLM2" -f "$TEXT" --prompt-len 2048 --continuation 64 \
    --samples "$samples" --press "$PRESSES" --budget 64,128,256,512 -t "$THREADS" --share-prefill
fi
if [[ $WHAT == all || $WHAT == niah ]]; then
  run niah_smollm2 . eval niah -m "$SMOLLM2" --haystack "$TEXT" --press "$PRESSES" --budget 64,256 \
    --lengths 1024,2048,4096,7936 --depths 0,25,50,75,100 -t "$THREADS" \
    --share-prefill --batch-decode
fi
if [[ $WHAT == all || $WHAT == niah-gemma ]]; then
  run niah_gemma3 . eval niah -m "$GEMMA3" --haystack "$TEXT" --press "$PRESSES" --budget 64,256 \
    --lengths 4096,16384,32000 --depths 0,50,100 -t "$THREADS" --share-prefill --batch-decode
fi
if [[ $WHAT == all || $WHAT == ruler ]]; then
  # RULER_MODES="query-agnostic" runs one mode (a finished mode's run would only re-render it).
  for mode in ${RULER_MODES:-query-aware query-agnostic}; do
    run "ruler_smollm2_$mode" . eval ruler -m "$SMOLLM2" --press "$PRESSES" --budget 64,256 \
      --lengths 4096 --samples 20 --haystack "$TEXT" --mode "$mode" -t "$THREADS" \
      --share-prefill --batch-decode
  done
fi
