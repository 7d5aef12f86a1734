#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# protokv serve next to llama-server on the same GGUF, same threads, same concurrency (issue 25's
# benchmark; prints figures, asserts nothing). Not part of CI.
#
#   bench/serve.sh [--model GGUF] [-t THREADS] [--prompt-tokens 4096] [--max-tokens 32]
#                  [--clients 1,4,8] [--press snapkv] [--budget 256] [--kv-memory MiB]
#                  [--hold-tokens 200] [--only throughput|capacity|turns]
#
# Part 1, throughput and latency: C concurrent clients (one streamed /v1/completions request
# each, every prompt a different slice of Debian's licence texts, greedy, ignore_eos) against
# llama-server (-np C, its default F16 cache), protokv with the full cache (F32), and protokv with
# --press at --budget: aggregate generated tokens/s, p50/p95 time to first token and inter-token
# latency (bench/serve_load.py).
# Part 2, sessions at a fixed --kv-memory, each generating --hold-tokens: computed from the KV
# bytes one request measures after prefill (full, then the press) and the admission rule of
# docs/server.md, then observed: that many clients plus two open long-lived streams at once, and
# bench/serve_capacity.py reads /metrics until every admitted session streams and the rest wait
# (the most sessions at once, the most bytes reserved against the cap, and whether disconnecting
# released them all); for llama-server, its slots of full F16 cache at that memory (computed).
# Part 3, a second chat turn over a long document with and without cache_prompt.
# Needs tools/llama_cpp/build.sh (llama-server) and tools/fetch_models.sh (default model).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
PROTOKV=${PROTOKV:-$ROOT/build/protokv}
LLAMA_SERVER=${LLAMA_SERVER:-$CACHE/llama.cpp-build/bin/llama-server}
MODEL="" THREADS=2 PROMPT_TOKENS=4096 MAX_TOKENS=32 CLIENTS=1,4,8 PRESS=snapkv BUDGET=256
KV_MEMORY=1024 HOLD_TOKENS=200 ONLY=all
while [[ $# -gt 0 ]]; do
  case $1 in
    --model) MODEL=$2; shift 2 ;;
    -t|--threads) THREADS=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --press) PRESS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --kv-memory) KV_MEMORY=$2; shift 2 ;;
    --hold-tokens) HOLD_TOKENS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    *) echo "serve.sh: unknown argument $1" >&2; exit 1 ;;
  esac
done
[[ -n $MODEL ]] || MODEL=$("$ROOT/tools/fetch_models.sh" --quiet | head -1)
[[ $ONLY =~ ^(all|throughput|capacity|turns)$ ]] || { echo "serve.sh: --only $ONLY" >&2; exit 1; }
[[ -x $PROTOKV ]] || { echo "serve.sh: no protokv at $PROTOKV" >&2; exit 1; }
[[ -x $LLAMA_SERVER ]] || { echo "serve.sh: no llama-server at $LLAMA_SERVER (tools/llama_cpp/build.sh)" >&2; exit 1; }
TEXT=$CACHE/text/debian-licences.txt
mkdir -p "$(dirname "$TEXT")"
[[ -s $TEXT ]] || (cd /usr/share/common-licenses &&
  cat GPL-3 GPL-2 LGPL-2.1 GFDL-1.3 Apache-2.0 MPL-2.0 Artistic CC0-1.0) >"$TEXT"
# ~4.6 characters per token on this text with SmolLM2's tokenizer (4096 x 3.6 characters gave
# 3156 tokens); the measured prompt_tokens_mean is printed.
PROMPT_CHARS=$((PROMPT_TOKENS * 46 / 10))
PORT=18400
LOG=$(mktemp)
server=""
stop_server() { [[ -n $server ]] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; server=""; }
trap 'stop_server; rm -f "$LOG"' EXIT
wait_ready() {
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
    kill -0 "$server" 2>/dev/null || { cat "$LOG" >&2; return 1; }
    sleep 0.2
  done
  return 1
}
load() { # clients, extra JSON
  python3 "$HERE/serve_load.py" --port "$PORT" --text "$TEXT" --clients "$1" --requests 1 \
    --prompt-chars "$PROMPT_CHARS" --max-tokens "$MAX_TOKENS" --extra "${2:-{\}}"
}
# Starts protokv serve on a fresh port, full cache or (mode "press") --press at --budget, plus
# any further flags; sets $server and $name.
start_protokv() { # mode, extra flags...
  local mode=$1
  shift
  local args=("$@")
  name="protokv full"
  if [[ $mode == press ]]; then
    args+=(--press "$PRESS" --budget "$BUDGET")
    name="protokv $PRESS B=$BUDGET"
  fi
  PORT=$((PORT + 1))  # a fresh port per server: no wait for the last one's sockets
  "$PROTOKV" serve -m "$MODEL" -t "$THREADS" --port "$PORT" "${args[@]}" >"$LOG" 2>&1 &
  server=$!
  wait_ready
}
row() { # name, JSON
  python3 "$HERE/serve_load.py" --row "$1" "$2"
}
per_slot=$((PROMPT_TOKENS + MAX_TOKENS + 256))

echo "model $MODEL, $THREADS threads, prompts of ~$PROMPT_TOKENS tokens"
if [[ $ONLY == all || $ONLY == throughput ]]; then
echo
echo "Throughput and latency, $MAX_TOKENS tokens generated per request:"
echo
echo "| server | clients | ok | prompt tokens | gen tokens/s | TTFT p50 s | TTFT p95 s | ITL p50 ms | ITL p95 ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
IFS=, read -ra client_counts <<<"$CLIENTS"
for c in "${client_counts[@]}"; do
  PORT=$((PORT + 1))  # a fresh port per server: no wait for the last one's sockets
  "$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" -np "$c" -c $((c * per_slot)) --port "$PORT" \
    --host 127.0.0.1 >"$LOG" 2>&1 &
  server=$!
  wait_ready
  row "llama-server" "$(load "$c")"
  stop_server
  for mode in full press; do
    start_protokv "$mode" --parallel "$c"
    row "$name" "$(load "$c")"
    stop_server
  done
done

fi

if [[ $ONLY == all || $ONLY == capacity ]]; then
echo
echo "Sessions at --kv-memory $KV_MEMORY MiB, prompts of ~$PROMPT_TOKENS tokens, $HOLD_TOKENS generated each:"
echo
# protokv admits a request on the full cache of its prompt plus max_tokens (its transient bound),
# then holds what its compressed cache measured after prefill plus room for its tokens: with one
# prompt in prefill at a time, capacity = 1 + (cap - transient) / held (computed from one
# request's measured bytes). Observed: computed + 2 clients at once, each stream alive for
# HOLD_TOKENS tokens, which must outlast the others' prefills (about 8 rounds per 4K prompt at
# --ubatch 512) for all of them to be live together. llama-server holds every slot's full F16
# cache (computed).
echo "| server | KV bytes per session | computed | observed at once (clients) | peak reserved / cap | released on disconnect |"
echo "| --- | --- | --- | --- | --- | --- |"
for mode in full press; do
  start_protokv "$mode" --kv-memory "$KV_MEMORY" --parallel 256 --queue 256
  body=$(python3 -c 'import json,sys; t=open(sys.argv[1],encoding="utf-8",errors="replace").read(); print(json.dumps({"prompt": t[:int(sys.argv[2])], "max_tokens": int(sys.argv[3]), "temperature": 0, "ignore_eos": True}))' "$TEXT" "$PROMPT_CHARS" "$HOLD_TOKENS")
  response=$(curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
    -d "$body")
  computed=$(python3 - "$response" "$KV_MEMORY" "$HOLD_TOKENS" <<'PY'
import json, sys
r, mib, max_tokens = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
kv, prompt = r["kv_compression"], r["usage"]["prompt_tokens"]
per_token = kv["kv_bytes_full"] / prompt
transient = kv["kv_bytes_full"] + per_token * max_tokens
held = kv["kv_bytes"] + per_token * max_tokens
cap = mib * 2**20
n = 0 if transient > cap else 1 + int((cap - transient) // held)
print(n, f"{held / 2**20:.1f} MiB (after prefill {kv['kv_bytes'] / 2**20:.1f} MiB, full {kv['kv_bytes_full'] / 2**20:.1f} MiB)")
PY
)
  n=${computed%% *}
  observed=$(python3 "$HERE/serve_capacity.py" --port "$PORT" --text "$TEXT" --clients $((n + 2)) \
    --prompt-chars "$PROMPT_CHARS" --max-tokens "$HOLD_TOKENS")
  stop_server
  python3 - "$name" "$n" "${computed#* }" "$observed" <<'PY'
import json, sys
name, n, held, o = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
mib = lambda b: f"{b / 2**20:.1f}"
print(f"| {name} | {held} | {n} | {o['sessions_at_once']} ({o['clients']}; {o['waiting']} waiting"
      f"{'' if o['settled'] else ', not settled'}) | {mib(o['kv_bytes_reserved_peak'])} / "
      f"{mib(o['kv_bytes_cap'])} MiB | {'yes' if o['released_after_disconnect'] else 'NO'} |")
PY
done
python3 - "$MODEL" "$KV_MEMORY" "$((PROMPT_TOKENS + HOLD_TOKENS + 256))" "$PROTOKV" <<'PY'
import re, subprocess, sys
model, mib, per_slot, protokv = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
info = subprocess.run([protokv, "info", "-m", model], capture_output=True, text=True).stdout
get = lambda key: int(re.search(rf"^{key}\s+(\d+)", info, re.M).group(1))
per_token = get("layers") * get("kv heads") * get("head dim") * 2 * 2  # K and V, F16
print(f"| llama-server (F16 cache, slots of {per_slot} tokens; every layer counted) | {per_token * per_slot / 2**20:.1f} MiB | {int(mib * 2**20 // (per_token * per_slot))} | (slots are allocated up front) | | |")
PY
fi

if [[ $ONLY == all || $ONLY == turns ]]; then
echo
echo "Second turn over a ~$PROMPT_TOKENS-token document (chat; the first turn's reply, then a short question):"
echo
echo "| server | first turn prompt ms | second turn prompt ms, cache_prompt true | cached tokens | second turn prompt ms, cache_prompt false |"
echo "| --- | --- | --- | --- | --- |"
for mode in full press; do
  start_protokv "$mode"
  python3 - "$name" "$PORT" "$TEXT" "$PROMPT_CHARS" <<'PY'
import http.client, json, sys
name, port, text_file, chars = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
doc = open(text_file, encoding="utf-8", errors="replace").read()[:chars]
def chat(messages, cache_prompt):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    c.request("POST", "/v1/chat/completions", json.dumps({"messages": messages, "max_tokens": 16,
              "temperature": 0, "cache_prompt": cache_prompt}), {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    c.close()
    return r
first = [{"role": "user", "content": doc + "\n\nWhich licence is this?"}]
r1 = chat(first, True)
second = first + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                  {"role": "user", "content": "Who may copy it?"}]
r2 = chat(second, True)
r3 = chat(second, False)
print(f"| {name} | {r1['timings']['prompt_ms']:.0f} | {r2['timings']['prompt_ms']:.0f} | "
      f"{r2['usage']['prompt_tokens_details']['cached_tokens']} of {r2['usage']['prompt_tokens']} | "
      f"{r3['timings']['prompt_ms']:.0f} |")
PY
  stop_server
done
fi
