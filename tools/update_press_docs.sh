#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Regenerates the press table of docs/methods.md (between its press-table markers) from the press
# table of the built binary: tools/update_press_docs.sh [build/protokv]. The test
# PressDocs.MethodsTableMatchesPressTable fails until this has been run after a press changes.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
binary=${1:-"$root/build/protokv"}
doc="$root/docs/methods.md"
table=$(mktemp)
trap 'rm -f "$table" "$table.md"' EXIT
"$binary" help-presses --markdown >"$table"
awk -v table="$table" '
  /^<!-- press-table: generated/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
  /^<!-- press-table end -->/ { skip = 0 }
  !skip { print }
' "$doc" >"$table.md"
grep -q '^<!-- press-table end -->' "$table.md" || { echo "no press-table markers in $doc" >&2; exit 1; }
mv "$table.md" "$doc"
