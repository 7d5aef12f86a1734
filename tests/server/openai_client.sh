#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Starts `protokv serve` on an ephemeral 127.0.0.1 port with the shipped recall model and runs
# openai_client.mjs (the official `openai` npm client) against it. The client comes from
# ${PROTOKV_CACHE:-~/.cache/protokv}/npm (tools/setup.sh installs it there, never in the repo).
# Exit 77 (ctest: skipped) when node or the client is missing, unless CI is set: then 1.
#   tests/server/openai_client.sh PROTOKV_BINARY
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PROTOKV=$1
NPM_DIR=${PROTOKV_CACHE:-$HOME/.cache/protokv}/npm
missing() {
  echo "openai_client.sh: $1" >&2
  if [[ ${CI:-} == true ]]; then exit 1; fi
  exit 77
}
command -v node >/dev/null || missing "node not found"
[[ -d $NPM_DIR/node_modules/openai ]] || missing "no openai client in $NPM_DIR (tools/setup.sh installs it)"

log=$(mktemp)
"$PROTOKV" serve -m "$ROOT/models/protokv-recall.gguf" --port 0 -t 1 --chat-template chatml \
  --api-key test-key 2>"$log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 100); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log")
  [[ -n $port ]] && break
  kill -0 $server 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
[[ -n $port ]] || { echo "openai_client.sh: the server did not start" >&2; cat "$log" >&2; exit 1; }
timeout 120 node "$HERE/openai_client.mjs" "$port" test-key "$NPM_DIR"
