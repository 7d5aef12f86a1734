#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Converts a training checkpoint (llama2.c recall.bin) to GGUF and measures single-needle NIAH
# with the full cache: tools/train/eval_checkpoint.sh RUN_DIR [LENGTHS] [DEPTHS]
set -eu
run=$1
lengths=${2:-256,512,1024,2048}
depths=${3:-0,25,50,75,100}
protokv=${PROTOKV:-build/protokv}
tok=${TOKENIZER:-/work/shared/models/stories260K/tok512.bin}
cp "$run/recall.bin" "$run/eval.bin"
"$protokv" convert "$run/eval.bin" "$tok" -o "$run/eval.gguf" --type f16 >/dev/null
python3 "$(dirname "$0")/set_rope_base.py" "$run/eval.gguf" "${ROPE_BASE:-500000}"
"$protokv" eval niah -m "$run/eval.gguf" --lengths "$lengths" --depths "$depths" --quiet -t 1 \
  --out "$run/niah_eval" --json >/dev/null
python3 - "$run/niah_eval/samples.jsonl" <<'PY'
import json, sys, collections
acc = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "meta" not in r:
        continue
    acc[r["meta"]["length"]].append(r["score"])
for k in sorted(acc):
    print(f"length {k}: {sum(acc[k])}/{len(acc[k])}")
PY
