#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The layers the build enforces (cmake/layers.cmake): through each layer's include view
# (<build>/layers/<layer>/), every header of that layer's own folder and public headers resolves,
# and a header of any layer it does not sit on, private or public, is "No such file".
#   tests/layer_views_check.sh BUILD_DIR CXX [-I DIR ...]
set -euo pipefail
build=$1 cxx=$2
shift 2
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
failures=0
fail() {
  echo "layer_views_check: $*" >&2
  failures=$((failures + 1))
}
# Preprocesses `#include "$2"` through view $1; prints the compiler's first error line.
include_error() {
  local view=$1 name=$2
  shift 2
  printf '#include "%s"\n' "$name" | "$cxx" -std=c++20 -E -x c++ -o /dev/null -I "$view" "$@" - 2>&1 |
    grep -m1 -E 'error|fatal' || true
}

views=("$build"/layers/*/)
[[ ${#views[@]} -ge 9 ]] || { echo "layer_views_check: no layer views under $build/layers" >&2; exit 1; }
for view in "${views[@]}"; do
  view=${view%/}
  layer=$(basename "$view")
  # Reachable: the layer's own headers (each preprocessed through its view alone: a header may
  # include nothing above its layer either, even one no source of the layer includes yet).
  for header in "$src/src/$layer"/*.h; do
    [[ -e $header ]] || continue
    err=$(include_error "$view" "$layer/$(basename "$header")" "$@")
    [[ -z $err ]] || fail "$layer: its own $layer/$(basename "$header") does not preprocess: $err"
  done
  for folder in "$src"/src/*/; do
    other=$(basename "$folder")
    [[ $other != "$layer" ]] || continue
    header=$(find "$folder" -maxdepth 1 -name '*.h' | sort | head -n1)
    [[ -n $header ]] || continue
    name=$other/$(basename "$header")
    err=$(include_error "$view" "$name" "$@")
    if [[ -e $view/$other ]]; then
      [[ -z $err ]] || fail "$layer: $name, of a layer below it, does not preprocess: $err"
    elif [[ $err != *"No such file"* && $err != *"file not found"* ]]; then
      fail "$layer: reaches $name of a layer it does not sit on (${err:-no error})"
    fi
  done
  for header in "$src"/include/protokv/*.h; do
    name=protokv/$(basename "$header")
    err=$(include_error "$view" "$name" "$@")
    if [[ -e $view/$name ]]; then
      [[ -z $err ]] || fail "$layer: public $name does not preprocess: $err"
    elif [[ $err != *"No such file"* && $err != *"file not found"* ]]; then
      fail "$layer: reaches public $name of a layer it does not sit on (${err:-no error})"
    fi
  done
done
# And each layer's sources are compiled against their view alone: no include path of theirs
# (compile_commands.json) reaches into the source tree around it.
python3 - "$build/compile_commands.json" "$src" "$build/layers" <<'PY' || failures=$((failures + 1))
import json, os, shlex, sys
commands, root, views = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3]
bad, checked = [], 0
for entry in json.load(open(commands)):
    path = os.path.realpath(entry["file"])
    parts = os.path.relpath(path, root).split(os.sep)
    if parts[0] != "src" or not os.path.isdir(os.path.join(views, parts[1])):
        continue  # the CLI, tests, fuzz targets and Python module see everything
    checked += 1
    args = entry.get("arguments") or shlex.split(entry["command"])
    dirs = [a[2:] or args[i + 1] for i, a in enumerate(args) if a.startswith("-I")]
    dirs += [args[i + 1] for i, a in enumerate(args) if a in ("-isystem", "-iquote")]
    for d in dirs:
        d = os.path.realpath(os.path.join(entry["directory"], d))
        if d.startswith(root + os.sep) and d != os.path.realpath(os.path.join(views, parts[1])):
            bad.append(f"{os.path.relpath(path, root)} is compiled with -I {d}")
for line in bad:
    print(f"layer_views_check: {line}", file=sys.stderr)
if checked == 0:
    print("layer_views_check: no layer source in compile_commands.json", file=sys.stderr)
sys.exit(1 if bad or checked == 0 else 0)
PY
[[ $failures == 0 ]] || exit 1
echo "layer_views_check: ${#views[@]} layer views, no header reaches above its layer"
