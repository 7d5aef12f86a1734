#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs kvpress and what it runs on (torch, transformers, gguf) at pinned versions into a venv
# in the cache folder, as tools/llama_cpp/build.sh does for llama.cpp: the oracle's side of
# tools/kvpress_oracle/oracle.py. Not part of CI's build (several GB: PyPI's torch wheel brings
# its CUDA libraries even on a machine without a GPU). Prints the venv's python; a second call
# only checks the versions.
set -euo pipefail
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
VENV=$CACHE/kvpress-venv
PINS=(kvpress==0.5.5 torch==2.15.0 transformers==5.2.0 gguf==0.19.0 numpy==2.4.6)
if [[ ! -x $VENV/bin/python ]]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}" >&2; then
  echo "kvpress_oracle/setup.sh: pip install ${PINS[*]} failed" >&2
  exit 1
fi
echo "$VENV/bin/python"
