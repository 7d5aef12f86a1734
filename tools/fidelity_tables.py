#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Markdown tables from the results.json of `protokv eval fidelity --out` (docs/results/fidelity_*.md).

  tools/fidelity_tables.py RESULTS_JSON

Prints two tables:
  1. every (press, budget): KV stored after prefill (MiB and share of the full cache), mean KL,
     the paired KL and top-1 differences against the run's reference press (the eval's own
     paired intervals), top-1 agreement, perplexity and top-B attention recall;
  2. equal memory: every row against the reference press at the largest budget that stores no
     more than it (2% slack), paired over the same samples (per_sample values, 95% t interval), so
     a press that keeps more bytes than its budget says (clusterkv keeps every entry, pod every
     value) is compared with what that memory buys the reference.
A '*' marks an interval that excludes 0. Standard library only (Debian's python3).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from longctx_tables import paired  # noqa: E402  (mean and 95% t half-width of paired differences)

MIB = 1024.0 * 1024.0
SLACK = 1.02  # "no more memory": within 2% (pyramidkv's per-layer rounding)


def signed(mean, half, digits):
    star = "*" if half is not None and abs(mean) > half else ""
    text = f"{mean:+.{digits}f}".replace("-", "−")
    return text + (f" ± {half:.{digits}f}{star}" if half is not None else "")


def interval(diff, digits):
    if not diff:
        return ""
    lo, hi = diff["ci95"]
    return signed(diff["mean"], (hi - lo) / 2.0, digits)


def point(r):
    """The row's budget, or its memory share and mean solved budget (--kv-memory-share)."""
    if r.get("memory_share"):
        solved = r.get("solved_budget")
        return f"m{r['memory_share']:g}" + (f" (B {solved:.0f})" if solved is not None else "")
    return str(r["budget"])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: fidelity_tables.py RESULTS_JSON")
    with open(sys.argv[1], encoding="utf-8") as f:
        report = json.load(f)
    full_bytes = report["full"]["kv_bytes"]
    rows = [r for r in report["results"] if r["press"] != "full"]
    reference = next((r["paired"]["reference"] for r in rows if "paired" in r), "full")
    n = report["config"]["samples"]
    print(f"Full cache: perplexity {report['full']['ppl']:.3f}, "
          f"{full_bytes / MIB:.1f} MiB of KV; {n} samples; reference press: {reference}.\n")

    print(f"| press | B | KV stored | KL | ΔKL vs {reference} | top-1 | Δtop-1 vs {reference} "
          "| ppl | recall |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['press']} | {point(r)} | refused: {r['error']} | | | | | | |")
            continue
        kv = f"{r['kv_bytes'] / MIB:.1f} MiB ({100.0 * r['kv_bytes'] / full_bytes:.0f}%)"
        p = r.get("paired", {})
        is_ref = r["press"] == reference
        print(f"| {r['press']} | {point(r)} | {kv} | {r['kl_mean']:.4f} | "
              f"{'(reference)' if is_ref else interval(p.get('kl_mean_diff'), 4)} | "
              f"{r['top1']:.3f} | {'' if is_ref else interval(p.get('top1_diff'), 3)} | "
              f"{r['ppl']:.3f} | {r['recall']:.3f} |")

    refs = sorted((r for r in rows if r["press"] == reference and "error" not in r),
                  key=lambda r: r["kv_bytes"])
    if not refs:
        return
    print(f"\nAt equal memory: each run against {reference} at the largest budget storing no more "
          "(paired over the same samples, 95% t interval; ΔKL < 0 and Δtop-1 > 0 favour the "
          "run).\n")
    print(f"| press | B | KV stored | {reference} at | ΔKL | Δtop-1 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r or r["press"] == reference:
            continue
        fits = [x for x in refs if x["kv_bytes"] <= r["kv_bytes"] * SLACK]
        if not fits:
            print(f"| {r['press']} | {point(r)} | {r['kv_bytes'] / MIB:.1f} MiB | "
                  f"(none stores as little) | | |")
            continue
        ref = fits[-1]
        kl = paired(r["per_sample"]["kl_mean"], ref["per_sample"]["kl_mean"])
        top1 = paired(r["per_sample"]["top1"], ref["per_sample"]["top1"])
        print(f"| {r['press']} | {point(r)} | {r['kv_bytes'] / MIB:.1f} MiB | "
              f"{'' if ref.get('memory_share') else 'B = '}{point(ref)} ({ref['kv_bytes'] / MIB:.1f} MiB) | {signed(*kl, 4)} | "
              f"{signed(*top1, 3)} |")


if __name__ == "__main__":
    main()
