#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Turns a training run's llama2.c checkpoint into the shipped GGUF:
#   tools/train/ship.sh RUN_DIR models/protokv-recall.gguf
# F16 matrices (norms stay F32), RoPE base written as trained.
set -eu
run=$1
out=$2
protokv=${PROTOKV:-build/protokv}
tok=${TOKENIZER:-/work/shared/models/stories260K/tok512.bin}
"$protokv" convert "$run/recall.bin" "$tok" -o "$out" --type f16 --name protokv-recall
python3 "$(dirname "$0")/set_rope_base.py" "$out" "${ROPE_BASE:-500000}"
"$protokv" info -m "$out"
