#!/usr/bin/env bash
# `protokv demo` finds the shipped recall model from any working folder: run from / with the
# build tree's binary, and after `cmake --install` into a temporary prefix (the checkout's
# models/ then out of reach). ctest InstalledDemoFindsTheShippedModel; BUILD_DIR is argument 1.
set -euo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
empty="$tmp/no-models"  # so that the demo does not prefer a fetched SmolLM2
mkdir -p "$empty"
demo_model() {  # the model path the demo chose (its JSON), running $1 from /
  (cd / && PROTOKV_MODELS_DIR="$empty" "$1" demo --json --quiet -t 1 --press full --budget 32 \
    --length 256) | python3 -c 'import json, sys; print(json.load(sys.stdin)["model"])'
}
from_build=$(demo_model "$build/protokv")
echo "build tree: $from_build"
case "$from_build" in */models/protokv-recall.gguf) ;; *) exit 1 ;; esac
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
from_install=$(demo_model "$tmp/prefix/bin/protokv")
echo "installed: $from_install"
[ "$from_install" = "$tmp/prefix/share/protokv/models/protokv-recall.gguf" ]
