#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sessions a server really holds at once under its KV-memory cap, observed (bench/serve.sh).

Opens C concurrent streamed /v1/completions requests, each a different slice of the text and
long enough to stay alive (max_tokens, ignore_eos), and polls /metrics until the server is
settled: every admitted session has streamed its first token (its prompt is prefilled and
compressed) and the others wait in the queue, unchanged for --settle seconds. Reports the most
sessions active at once, the most KV bytes reserved and held, the cap, then disconnects every
client and reports whether the reserved bytes went back to 0 (cancelled requests release their
memory). Standard library only. Prints one JSON object.

  serve_capacity.py --port P --text FILE --clients C --prompt-chars N --max-tokens M
                    [--extra JSON] [--settle S] [--timeout S]
"""
import argparse
import http.client
import json
import re
import socket
import threading
import time


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^protokv_(\w+) (\S+)$", text, re.M)}


class Client(threading.Thread):
    """One streamed request; `first_token` is set once a token arrives."""

    def __init__(self, port, body):
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        self.body = body
        self.first_token = threading.Event()
        self.status = None
        self.prompt_tokens = 0

    def run(self):
        try:
            self.conn.request("POST", "/v1/completions", json.dumps(self.body),
                              {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            self.status = resp.status
            if resp.status != 200:
                resp.read()
                return
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    if (event.get("choices") or [{}])[0].get("text"):
                        self.first_token.set()
        except (OSError, http.client.HTTPException, ValueError, AttributeError):
            pass  # disconnected by stop() (http.client may find its socket gone mid-read)

    def stop(self):
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--prompt-chars", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--extra", default="{}")
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=3600.0)
    args = ap.parse_args()
    text = open(args.text, encoding="utf-8", errors="replace").read()
    extra = json.loads(args.extra)
    clients = []
    for i in range(args.clients):
        start = (i * args.prompt_chars // 3) % max(1, len(text) - args.prompt_chars)
        body = {"prompt": text[start:start + args.prompt_chars], "max_tokens": args.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True, **extra}
        clients.append(Client(args.port, body))
    for c in clients:
        c.start()
    peak = {"active_sessions": 0.0, "kv_bytes_reserved": 0.0, "kv_bytes_held": 0.0}
    deadline = time.monotonic() + args.timeout
    settled_since, last_state, m = None, None, {}
    while time.monotonic() < deadline:
        m = metrics(args.port)
        for key in peak:
            peak[key] = max(peak[key], m.get(key, 0.0))
        streaming = sum(c.first_token.is_set() for c in clients)
        refused = sum(c.status not in (None, 200) for c in clients)
        state = (m.get("active_sessions"), m.get("queue_length"), streaming, refused)
        # Settled: every active session streams, the rest wait (or were refused), unchanged.
        if (streaming == m.get("active_sessions") and
                streaming + m.get("queue_length", 0) + refused == args.clients):
            if state != last_state:
                settled_since = time.monotonic()
            elif time.monotonic() - settled_since >= args.settle:
                break
        else:
            settled_since = None
        last_state = state
        time.sleep(0.5)
    settled = settled_since is not None and time.monotonic() < deadline
    for c in clients:
        c.stop()
    for c in clients:
        c.join(timeout=30)
    released = None
    for _ in range(100):  # the scheduler notices a disconnect at its next step
        after = metrics(args.port)
        if after.get("kv_bytes_reserved", 0.0) == 0.0 and after.get("active_sessions", 0.0) == 0.0:
            released = True
            break
        released = False
        time.sleep(0.2)
    print(json.dumps({
        "clients": args.clients, "settled": settled,
        "sessions_at_once": int(peak["active_sessions"]),
        "waiting": int(m.get("queue_length", 0)),
        "refused": sum(c.status not in (None, 200) for c in clients),
        "kv_bytes_cap": m.get("kv_bytes_cap", 0.0),
        "kv_bytes_reserved_peak": peak["kv_bytes_reserved"],
        "kv_bytes_held_peak": peak["kv_bytes_held"],
        "released_after_disconnect": released,
    }))


if __name__ == "__main__":
    main()
