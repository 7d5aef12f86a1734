#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Load generator for bench/serve.sh: C concurrent clients, each sending R streamed
/v1/completions requests of a long prompt to an OpenAI-compatible server (protokv serve or
llama-server), measuring time to first token (TTFT), inter-token latency (ITL) and aggregate
generated tokens per second. Standard library only. Prints one JSON object.

  serve_load.py --port P --text FILE --clients C --requests R --prompt-chars N --max-tokens M
                [--extra JSON]   # merged into every request body (e.g. kv_compression)
"""
import argparse
import http.client
import json
import statistics
import threading
import time


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(q / 100 * (len(values) - 1))))
    return values[k]


def one_request(port, body, timeout):
    """Returns (ttft_s, [itl_s...], generated_tokens, prompt_tokens, status)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        conn.close()
        return None, [], 0, 0, resp.status
    ttft, last, itl, pieces, usage = None, None, [], 0, {}
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("usage"):
            usage = event["usage"]
        choices = event.get("choices") or []
        text = choices[0].get("text") if choices else None
        if text:
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            else:
                itl.append(now - last)
            last = now
            pieces += 1
    conn.close()
    return ttft, itl, usage.get("completion_tokens", pieces), usage.get("prompt_tokens", 0), 200


def row(name, result):
    """One markdown row of bench/serve.sh's table from this script's JSON output."""
    r = json.loads(result)

    def f(v, scale=1.0, digits=2):
        return "-" if v is None else f"{v * scale:.{digits}f}"

    return (f"| {name} | {r['clients']} | {r['ok']}/{r['requests']} | "
            f"{f(r['prompt_tokens_mean'], 1, 0)} | {f(r['tokens_per_s'])} | {f(r['ttft_p50_s'])} | "
            f"{f(r['ttft_p95_s'])} | {f(r['itl_p50_ms'], 1, 1)} | {f(r['itl_p95_ms'], 1, 1)} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--row", nargs=2, metavar=("NAME", "JSON"),
                   help="print the markdown row of a result and exit")
    p.add_argument("--port", type=int)
    p.add_argument("--text")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--requests", type=int, default=1)
    p.add_argument("--prompt-chars", type=int, default=16000)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--extra", default="{}")
    p.add_argument("--timeout", type=float, default=1800)
    a = p.parse_args()
    if a.row:
        print(row(*a.row))
        return
    if a.port is None or a.text is None:
        p.error("--port and --text are required")
    text = open(a.text, encoding="utf-8", errors="replace").read()
    text = text * (1 + 2 * a.prompt_chars * a.clients * a.requests // max(len(text), 1))
    extra = json.loads(a.extra)
    results, lock = [], threading.Lock()

    def client(c):
        for r in range(a.requests):
            # A different slice of the text for every request: no prompt cache can help.
            offset = (c * a.requests + r) * 7919
            body = {"prompt": text[offset:offset + a.prompt_chars], "max_tokens": a.max_tokens,
                    "temperature": 0, "stream": True, "ignore_eos": True,
                    "stream_options": {"include_usage": True}, "cache_prompt": False}
            body.update(extra)
            res = one_request(a.port, body, a.timeout)
            with lock:
                results.append(res)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ok = [r for r in results if r[4] == 200 and r[0] is not None]
    ttft = [r[0] for r in ok]
    itl = [x for r in ok for x in r[1]]
    generated = sum(r[2] for r in ok)
    print(json.dumps({
        "clients": a.clients, "requests": len(results), "ok": len(ok),
        "statuses": sorted({r[4] for r in results}),
        "prompt_tokens_mean": statistics.mean([r[3] for r in ok]) if ok else None,
        "generated_tokens": generated, "wall_s": wall,
        "tokens_per_s": generated / wall if wall > 0 else None,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
        "itl_p50_ms": 1000 * percentile(itl, 50) if itl else None,
        "itl_p95_ms": 1000 * percentile(itl, 95) if itl else None,
    }))


if __name__ == "__main__":
    main()
