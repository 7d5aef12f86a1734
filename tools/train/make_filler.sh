#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Filler corpus for the recall model: 400 short stories sampled from stories260K (temperature
# 0.9, seeds 1..400, four opening phrases), ~350 KB. stories260K (llama2.c, MIT) was trained on
# TinyStories (CDLA-Sharing-1.0); its samples are used only as filler text.
#   tools/train/make_filler.sh OUT.txt
set -eu
out=$1
protokv=${PROTOKV:-build/protokv}
shared=${SHARED:-/work/shared/models/stories260K}
gguf=$(mktemp --suffix .gguf)
"$protokv" convert "$shared/stories260K.bin" "$shared/tok512.bin" -o "$gguf" >/dev/null
: >"$out"
for s in $(seq 1 400); do
  p="Once upon a time"
  case $((s % 4)) in 1) p="One day" ;; 2) p="Tom and Lily" ;; 3) p="There was a" ;; esac
  printf "%s" "$p" >>"$out"
  "$protokv" generate -m "$gguf" -p "$p" -n 400 --temp 0.9 --seed "$s" -t 1 2>/dev/null >>"$out"
  printf "\n" >>"$out"
done
rm -f "$gguf"
