#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# docs/deploy.md, tested: two `protokv serve` replicas (the shipped recall model, ephemeral
# 127.0.0.1 ports) behind nginx with consistent hashing on the X-Conversation-Id header. Checks
# that both replicas serve, that every turn of a conversation lands on the same replica, and that
# the follow-up turn there continues the cached conversation (cached_tokens > 0). Loopback only,
# 24 requests. Exit 77 (ctest: skipped) without nginx, unless CI is set: then 1.
#   tests/server/replicas_nginx.sh PROTOKV_BINARY
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PROTOKV=$1
NGINX=$(command -v nginx || true)
[[ -n $NGINX ]] || NGINX=/usr/sbin/nginx
if [[ ! -x $NGINX ]]; then
  echo "replicas_nginx.sh: nginx not found (Debian package nginx; tools/setup.sh installs it)" >&2
  [[ ${CI:-} == true ]] && exit 1
  exit 77
fi

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "replicas_nginx.sh: $*" >&2
  cat "$dir"/*.log >&2 2>/dev/null || true
  exit 1
}

start_replica() { # name; sets $port
  : >"$dir/$1.log"  # before the replica opens it: the first read below must find it
  "$PROTOKV" serve -m "$ROOT/models/protokv-recall.gguf" --port 0 -t 1 --chat-template chatml \
    --alias "$1" >/dev/null 2>"$dir/$1.log" &
  pids+=($!)
  port=""
  for _ in $(seq 100); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$dir/$1.log")
    [[ -n $port ]] && return
    sleep 0.1
  done
  fail "replica $1 did not start"
}
start_replica replica-a
port_a=$port
start_replica replica-b
port_b=$port
proxy_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

cat >"$dir/nginx.conf" <<CONF
daemon off;
master_process off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  upstream protokv {
    hash \$http_x_conversation_id consistent;
    server 127.0.0.1:$port_a;
    server 127.0.0.1:$port_b;
  }
  server {
    listen 127.0.0.1:$proxy_port;
    location / {
      proxy_pass http://protokv;
      proxy_http_version 1.1;
      proxy_buffering off;
      proxy_read_timeout 120s;
    }
  }
}
CONF
"$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/nginx-error.log" &
pids+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$proxy_port/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$proxy_port/health" >/dev/null || fail "nginx did not come up"

python3 - "$proxy_port" <<'PY' || fail "routing check failed"
import http.client, json, sys
port = int(sys.argv[1])

def chat(conversation, messages):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions",
              json.dumps({"messages": messages, "max_tokens": 4, "temperature": 0}),
              {"Content-Type": "application/json", "X-Conversation-Id": conversation})
    r = c.getresponse()
    body = json.loads(r.read())
    c.close()
    assert r.status == 200, body
    return body

served = {}
for i in range(12):
    conversation = f"conversation-{i}"
    first = [{"role": "user", "content": f"alpha {i} beta {i + 7}. The value of beta is"}]
    r1 = chat(conversation, first)
    second = first + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "and alpha?"}]
    r2 = chat(conversation, second)
    assert r1["model"] == r2["model"], f"{conversation} moved from {r1['model']} to {r2['model']}"
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0, f"{conversation}: the follow-up turn did not find its cache"
    served.setdefault(r1["model"], []).append(conversation)
assert set(served) == {"replica-a", "replica-b"}, f"only {sorted(served)} served"
print("replicas_nginx: " + ", ".join(f"{k} {len(v)} conversations" for k, v in sorted(served.items())))
PY
