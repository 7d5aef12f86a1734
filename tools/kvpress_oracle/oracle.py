#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvpress as an oracle on the same weights: runs kvpress's presses on a GGUF model (transformers
dequantises it) and writes what each one kept and the logits that follow, as a fixture that
tests/test_kvpress_oracle.cpp checks protokv against.

    PY=$(tools/kvpress_oracle/setup.sh)
    $PY tools/kvpress_oracle/oracle.py --model models/protokv-recall.gguf \\
        --text ~/.cache/protokv/text/debian-licences.txt --tokens 512 \\
        --out tests/fixtures/kvpress_oracle/recall.json

The prompt is tokenized by protokv (`protokv tokenize`), so both engines see the same ids. For
each press: kvpress compresses the prompt's cache during prefill (its forward hooks), then the
next `--continuation` tokens of the text are fed teacher-forced at their true positions (as
kvpress's pipeline does) and the top logits of every row are kept. What a press kept is read
from the compressed cache itself: each kept key row is found among the uncompressed cache's rows
of its layer and KV head (prefill compression changes the cache, not the hidden states, so the
rows are bit-identical), so no kvpress internals are patched; AdaKVPress, which keeps every entry
and masks the pruned ones in attention, is read from its attention modules' masked_key_indices.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import metadata

import torch

# kvpress press, its options, the protokv spec that should keep the same entries, and what the
# comparison expects: "same" (identical selection but for float near-ties) or "differs" (a
# documented difference, docs/methods.md "kvpress as an oracle"; the test bounds the overlap).
PRESSES = [
    ("StreamingLLMPress", {"n_sink": 4}, "streaming_llm:sinks=4", "same"),
    ("KnormPress", {}, "knorm", "same"),
    ("SnapKVPress", {"window_size": 64, "kernel_size": 5}, "snapkv:window=64,pool=5,pool_type=avg",
     "same"),
    ("ExpectedAttentionPress", {}, "expected_attention", "same"),
    ("ObservedAttentionPress", {}, "h2o", "differs"),
    ("PyramidKVPress", {"window_size": 64, "kernel_size": 5},
     "pyramidkv:window=64,pool=5,pool_type=avg", "differs"),
    # kvpress's AdaKV keeps every entry and masks the pruned ones in attention (sdpa only): what
    # it kept is read from the attention modules' masked_key_indices instead of the cache.
    ("AdaKVPress", {"press": ("SnapKVPress", {"window_size": 64, "kernel_size": 5}),
                    "alpha_safeguard": 0.2},
     "adakv:window=64,pool=5,pool_type=avg,floor=0.2", "differs"),
]


def tokenize(protokv: str, model: str, text: str) -> list[int]:
    out = subprocess.run([protokv, "tokenize", "-m", model, "--bos", "--json", "-p", text],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ids"]


def bitmask_hex(kept: list[int], n: int) -> str:
    """Token j -> bit j % 4 of hex digit j // 4."""
    nibbles = [0] * ((n + 3) // 4)
    for j in kept:
        nibbles[j // 4] |= 1 << (j % 4)
    return "".join("0123456789abcdef"[x] for x in nibbles)


def top_logits(logits: torch.Tensor, k: int) -> list[list[list[float]]]:
    values, ids = logits.topk(k, dim=-1)
    return [[[int(i), float(v)] for i, v in zip(row_ids, row_values)]
            for row_ids, row_values in zip(ids.tolist(), values.tolist())]


def run(model, ids: list[int], continuation: list[int], press=None):
    from transformers import DynamicCache

    cache = DynamicCache()
    prompt = torch.tensor([ids])
    with torch.no_grad():
        if press is None:
            model(prompt, past_key_values=cache)
        else:
            with press(model):
                model(prompt, past_key_values=cache)
        n = len(ids)
        positions = torch.arange(n, n + len(continuation)).unsqueeze(0)
        logits = model(torch.tensor([continuation]), past_key_values=cache,
                       position_ids=positions).logits[0]
    # The prompt's rows only (the continuation appended its own).
    keys = [layer.keys[0, :, :n].clone() if press is None else layer.keys[0, :, : -len(continuation)].clone()
            for layer in cache.layers]
    return keys, logits


def masked_kept(model, n: int) -> list[list[list[int]]]:
    """AdaKVPress: per layer and KV head, the positions its attention masks do not hide."""
    kept = []
    for layer in model.model.layers:
        attention = layer.self_attn
        pruned = [set() for _ in range(model.config.num_key_value_heads)]
        _, heads, positions = attention.masked_key_indices
        for h, j in zip(heads.tolist(), positions.tolist()):
            pruned[h].add(j)
        kept.append([[j for j in range(n) if j not in p] for p in pruned])
    return kept


def make_press(kvpress, cls: str, options: dict, ratio: float):
    options = dict(options)
    if "press" in options:  # a wrapper press: build the inner one with the ratio
        inner_cls, inner_options = options.pop("press")
        inner = getattr(kvpress, inner_cls)(compression_ratio=ratio, **inner_options)
        return getattr(kvpress, cls)(press=inner, **options)
    return getattr(kvpress, cls)(compression_ratio=ratio, **options)


def kept_indices(full_keys: torch.Tensor, kept_keys: torch.Tensor) -> list[int]:
    """Indices of kept_keys' rows among full_keys' rows (one KV head), ascending."""
    where = {full_keys[j].numpy().tobytes(): j for j in range(full_keys.shape[0])}
    found = []
    for row in kept_keys:
        j = where.get(row.numpy().tobytes())
        if j is None:
            raise SystemExit("oracle.py: a kept key row is not a row of the full cache")
        found.append(j)
    return sorted(found)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--offset", type=int, default=0, help="first character of the text used")
    ap.add_argument("--tokens", type=int, default=512, help="prompt tokens (BOS included)")
    ap.add_argument("--continuation", type=int, default=16)
    ap.add_argument("--ratio", type=float, default=0.75, help="kvpress compression_ratio")
    ap.add_argument("--top", type=int, default=8, help="logits kept per continuation row")
    ap.add_argument("--protokv", default=os.path.join(os.path.dirname(__file__), "../../build/protokv"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import kvpress
    from transformers import AutoModelForCausalLM

    text = open(args.text, encoding="utf-8", errors="replace").read()[args.offset:]
    # Enough characters for the prompt and its continuation, then cut at the token count.
    ids = tokenize(args.protokv, args.model, text[: 8 * (args.tokens + args.continuation) + 64])
    if len(ids) < args.tokens + args.continuation:
        raise SystemExit(f"oracle.py: the text gives only {len(ids)} tokens")
    prompt, continuation = ids[: args.tokens], ids[args.tokens: args.tokens + args.continuation]

    directory, name = os.path.split(os.path.abspath(args.model))
    def load(attention: str):
        return AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                    attn_implementation=attention).eval()

    model = load("eager")  # ObservedAttention needs the attention weights
    sdpa_model = None  # AdaKV's masks need sdpa
    full_keys, full_logits = run(model, prompt, continuation)
    n = len(prompt)
    fixture = {
        "note": "written by tools/kvpress_oracle/oracle.py; do not edit",
        "model": os.path.basename(args.model),
        "versions": {p: metadata.version(p) for p in ("kvpress", "torch", "transformers", "gguf")},
        "compression_ratio": args.ratio,
        "prompt": prompt,
        "continuation": continuation,
        "full": {"top_logits": top_logits(full_logits, args.top)},
        "presses": [],
    }
    for cls, options, spec, expect in PRESSES:
        press = make_press(kvpress, cls, options, args.ratio)
        if cls == "AdaKVPress":
            sdpa_model = sdpa_model or load("sdpa")
            keys, logits = run(sdpa_model, prompt, continuation, press)
            kept = [[bitmask_hex(heads, n) for heads in layer] for layer in masked_kept(sdpa_model, n)]
        else:
            keys, logits = run(model, prompt, continuation, press)
            kept = [[bitmask_hex(kept_indices(full_keys[layer][h], keys[layer][h]), n)
                     for h in range(keys[layer].shape[0])] for layer in range(len(keys))]
        fixture["presses"].append({
            "kvpress": cls, "options": json.loads(json.dumps(options)), "protokv": spec,
            "expect": expect,
            "budget": int(n * (1 - args.ratio)),  # ScorerPress.compress: int(k_len * (1 - ratio))
            "kept": kept, "top_logits": top_logits(logits, args.top),
        })
        counts = [sum(bin(int(c, 16)).count("1") for head in layer for c in head) for layer in kept]
        print(f"{cls}: kept {counts} entries per layer (all KV heads)", file=sys.stderr)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"oracle.py: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
