#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Converts a kept training checkpoint (llama2.c recall_stepN.bin) to GGUF and measures RULER at
# 2048 tokens with the full cache on the tasks issue 12 asks for:
#   tools/train/eval_ruler_checkpoint.sh RUN/recall_step900.bin OUT_DIR [SEED] [SAMPLES]
# Pick checkpoints on a seed other than the reported one (the default 42), then report on 42.
set -eu
bin=$1
out=$2
seed=${3:-7}
samples=${4:-8}
protokv=${PROTOKV:-build/protokv}
tok=${TOKENIZER:-/work/shared/models/stories260K/tok512.bin}
mkdir -p "$out"
"$protokv" convert "$bin" "$tok" -o "$out/model.gguf" --type f16 --name protokv-recall >/dev/null
python3 "$(dirname "$0")/set_rope_base.py" "$out/model.gguf" "${ROPE_BASE:-500000}"
"$protokv" eval ruler -m "$out/model.gguf" --press full --lengths 2048 --samples "$samples" \
  --tasks niah_single_1,niah_multikey_1,niah_multikey_3,niah_multivalue,vt --seed "$seed" -t 1 \
  --quiet --out "$out/ruler" | sed -n 2,4p
