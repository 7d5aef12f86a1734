#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Turns the output folders of `protokv eval niah` and `protokv eval ruler` (as run by
tools/longctx_tables.sh) into the long-context tables of docs/results/longcontext_recall_model.md and figures.

Writes:
  FIGURES/niah_b<B>.svg  one figure per budget: the NIAH heat maps of every run side by side
                         (the full cache first), composed from the eval's heatmap_<run>.svg files;
  the markdown block (stdout, or between the file's longctx-tables markers with --readme):
  NIAH accuracy per length, RULER accuracy per task, the paired difference against the full cache
  per task with its 95% Student-t interval, and the discrimination check of issue 12 (two presses
  at the same budget >= 20 points apart on one task), with the paired interval of that gap.

Every number comes from the folders: re-run the shell script after the model changes.
Standard library only (Debian's python3).
"""
import argparse
import json
import math
import os
import re
import sys
from collections import defaultdict

# Two-sided 95% Student-t quantiles t(0.975, df), df = 1..30 (the values eval/statistics.cpp
# uses); beyond 30 the Cornish-Fisher expansion below is within 1e-3.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


# A run whose KV cache at answer time holds at least this share of the full cache's bytes is
# marked as not compressing (clusterkv and pod on a 2-layer model).
KEEPS_ALL = 0.9


def t975(df):
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def paired(a, b):
    """Mean of a - b and the half-width of its 95% t interval (None with fewer than 2 pairs)."""
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    if n == 0:
        return None, None
    mean = sum(d) / n
    if n < 2:
        return mean, None
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean, t975(n - 1) * math.sqrt(var / n)


def read_records(folder):
    """run -> id -> record (scored and skipped), from samples.jsonl."""
    records = defaultdict(dict)
    with open(os.path.join(folder, "samples.jsonl"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "run" in r:
                records[r["run"]][r["id"]] = r
    return records


def run_labels(results):
    return [r["label"] for r in results["config"]["runs"]]


def budget_of(label):
    return int(label.split("@")[1]) if "@" in label else None


def press_of(label):
    return label.split("@")[0]


def fmt_diff(mean, half):
    if mean is None:
        return "-"
    if half is None:
        return f"{100 * mean:+.1f}"
    return f"{100 * mean:+.1f} ± {100 * half:.1f}"


def scored(rec):
    return {i: r["score"] for i, r in rec.items() if not r.get("error")}


def mean_score(rec, ids=None):
    s = scored(rec)
    if ids is not None:
        s = {i: v for i, v in s.items() if i in ids}
    return (sum(s.values()) / len(s)) if s else None


def fmt_share(v):
    return "-" if v is None else f"{100 * v:.1f}%"


def fmt_pct(v):
    return "-" if v is None else f"{100 * v:.0f}"


def storage(records, full_label="full"):
    """Per run: mean KV bytes at answer and attended at the last decode step, and whether the run
    keeps the whole cache in memory (stores as much as the full cache)."""
    out = {}
    for run, rec in records.items():
        ok = [r for r in rec.values() if not r.get("error")]
        if not ok:
            out[run] = (None, None)
            continue
        out[run] = (sum(r["kv_bytes"] for r in ok) / len(ok),
                    sum(r.get("attended_kv_bytes", 0) for r in ok) / len(ok))
    return out


def compose_figure(niah_dir, labels, path, title, columns=5, scale=0.5):
    """Small multiples: each run's heat map, scaled, in a grid (one SVG with nested <svg>s)."""
    w, h = 708, 398  # the eval's heat-map size (src/eval/svg_plot.cpp)
    cw, ch = int(w * scale), int(h * scale)
    rows = (len(labels) + columns - 1) // columns
    parts = []
    for k, label in enumerate(labels):
        name = "heatmap_" + re.sub(r"[/:,=]", "_", label) + ".svg"
        with open(os.path.join(niah_dir, name), encoding="utf-8") as f:
            svg = f.read()
        m = re.match(r'\s*<svg[^>]*width="(\d+)" height="(\d+)"[^>]*>', svg)
        if not m:
            sys.exit(f"longctx_tables: {name} is not an eval heat map")
        iw, ih = int(m.group(1)), int(m.group(2))
        inner = svg[m.end():svg.rindex("</svg>")]
        x, y = (k % columns) * cw, 30 + (k // columns) * ch
        parts.append(f'<svg x="{x}" y="{y}" width="{cw}" height="{ch}" '
                     f'viewBox="0 0 {iw} {ih}">{inner}</svg>')
    width, height = columns * cw, 30 + rows * ch
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                f'font-family="sans-serif" font-size="11">\n'
                f'<rect width="100%" height="100%" fill="white"/>\n'
                f'<text x="{width // 2}" y="20" font-size="15" text-anchor="middle">'
                f'{title}</text>\n' + "\n".join(parts) + "\n</svg>\n")


def task_ids(rec, task):
    return {i for i, r in rec.items() if r["meta"].get("task") == task}


def ruler_tables(p, ruler, ruler_rec, tasks, keeps_all, ruler_share):
    """The RULER tables: accuracy per task and the paired differences against the full cache."""
    ruler_len = max(ruler["config"]["ruler"]["lengths"])
    ruler_samples = ruler["config"]["ruler"]["samples_per_task_and_length"]
    p(f"**RULER** at {ruler_len} tokens ({ruler_samples} samples per task; RULER's scoring, "
      "×100; `avg`: mean over the tasks the run scored):")
    p("")
    short = {t: t.replace("niah_", "").replace("single_", "s").replace("multikey_", "mk")
             .replace("multivalue", "mv").replace("multiquery", "mq") for t in tasks}
    p("| run | " + " | ".join(short[t] for t in tasks)
      + " | avg | Δ avg vs full (95%) | KV kept |")
    p("| --- | " + " | ".join("---:" for _ in tasks) + " | ---: | ---: | ---: |")
    ruler_labels = run_labels(ruler)
    rfull = scored(ruler_rec["full"])

    task_mean = {}
    for l in ruler_labels:
        rec = ruler_rec[l]
        s = scored(rec)
        if not s:
            p(f"| `{l}` | " + " | ".join("-" for _ in tasks) + " | - | skipped | - |")
            continue
        vals = []
        for t in tasks:
            task_mean[(l, t)] = mean_score(rec, task_ids(rec, t))
            vals.append(task_mean[(l, t)])
        present = [v for v in vals if v is not None]
        avg = sum(present) / len(present) if present else None
        common = sorted(set(s) & set(rfull))
        diff = "-" if l == "full" else fmt_diff(*paired([s[i] for i in common],
                                                        [rfull[i] for i in common]))
        note = " †" if l in keeps_all else ""
        p(f"| `{l}`{note} | " + " | ".join(fmt_pct(v) for v in vals)
          + f" | {fmt_pct(avg)} | {diff} | {fmt_share(ruler_share(l))} |")
    p("")
    p("Paired difference against the full cache per task (points, 95% Student-t interval over "
      f"the {ruler_samples} samples; `± 0.0`: every sample moved the same way):")
    p("")
    p("| run | " + " | ".join(short[t] for t in tasks) + " |")
    p("| --- | " + " | ".join("---:" for _ in tasks) + " |")
    for l in ruler_labels:
        if l == "full" or not scored(ruler_rec[l]):
            continue
        s = scored(ruler_rec[l])
        cells = []
        for t in tasks:
            ids = sorted(task_ids(ruler_rec[l], t) & set(s) & set(rfull))
            cells.append(fmt_diff(*paired([s[i] for i in ids], [rfull[i] for i in ids])))
        p(f"| `{l}` | " + " | ".join(cells) + " |")
    p("")
    p("Task names: s1–s3 `niah_single_1..3`, mk1–mk3 `niah_multikey_1..3`, mv "
      "`niah_multivalue`, mq `niah_multiquery`, vt, cwe, fwe. KV kept: KV bytes at answer time "
      "as a share of the full cache's (clusterkv stores everything, attends a subset). † keeps "
      f"at least {100 * KEEPS_ALL:.0f}% of the full cache on this model: no eviction to rank, "
      "see below.")
    p("")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--niah", required=True, help="eval niah --out folder")
    ap.add_argument("--ruler", help="eval ruler --out folder (without it: NIAH only)")
    ap.add_argument("--figures", required=True, help="folder for the composed NIAH figures")
    ap.add_argument("--figures-link", default=None,
                    help="path of --figures as the markdown links it (default: as given)")
    ap.add_argument("--readme", help="replace the block between the longctx-tables markers")
    ap.add_argument("--commands", default="", help="file with the commands, quoted in the block")
    args = ap.parse_args()

    niah = json.load(open(os.path.join(args.niah, "results.json"), encoding="utf-8"))
    niah_rec = read_records(args.niah)
    ruler = ruler_rec = None
    if args.ruler:
        ruler = json.load(open(os.path.join(args.ruler, "results.json"), encoding="utf-8"))
        ruler_rec = read_records(args.ruler)
    labels = run_labels(niah)
    budgets = sorted({budget_of(l) for l in labels if budget_of(l) is not None})
    model = niah["config"]["model"]
    lengths = niah["config"]["niah"]["lengths"]
    depths = niah["config"]["niah"]["depths"]
    per_cell = niah["config"]["niah"]["samples_per_cell"]
    longest = max(lengths)
    niah_store = storage(niah_rec)
    ruler_store = storage(ruler_rec) if ruler else {}
    tasks = ruler["config"]["ruler"]["tasks"] if ruler else []

    def kv_share(store, label):
        """Mean KV bytes at answer as a share of the full cache's (None: not scored)."""
        kv, full = store.get(label, (None,))[0], store["full"][0]
        return None if kv is None or not full else kv / full

    # Runs that keep (nearly) the whole cache in memory in either benchmark: no eviction to rank.
    keeps_all = {l for l in labels if l != "full"
                 and any((kv_share(st, l) or 0) >= KEEPS_ALL for st in (niah_store, ruler_store)
                         if st)}
    figures_link = args.figures_link or args.figures
    os.makedirs(args.figures, exist_ok=True)

    out = []
    p = out.append
    p(f"Model: `{os.path.basename(model['path'])}` ({model['parameters']:,} parameters, "
      f"{model['n_layers']} layers, {model['n_heads']} query / {model['n_kv_heads']} KV heads, "
      f"head dim {model['head_dim']}, context {model['context_length']}). Budgets are KV "
      f"entries kept per KV head per layer: "
      + ", ".join(f"{b} ({100 * b / longest:.1f}%)" for b in budgets)
      + f" of a {longest}-token prompt.")
    p("")
    # ---- NIAH ----
    p(f"**NIAH** ({len(lengths)} lengths × {len(depths)} depths × {per_cell} sample(s) = "
      f"{len(lengths) * len(depths) * per_cell} prompts per run; accuracy %, and the paired "
      "difference against the full cache on the same prompts with its 95% interval):")
    p("")
    for b in budgets:
        runs = ["full"] + [l for l in labels if budget_of(l) == b]
        name = f"niah_b{b}.svg"
        compose_figure(args.niah, runs, os.path.join(args.figures, name),
                       f"NIAH heat maps at budget {b} ({100 * b / longest:.1f}% of "
                       f"{longest} tokens): accuracy % per length × depth")
        p(f"![NIAH heat maps, budget {b}]({figures_link}/{name})")
        p("")
    p("| run | " + " | ".join(str(L) for L in lengths) + " | all | Δ vs full (95%) | KV kept |")
    p("| --- | " + " | ".join("---:" for _ in lengths) + " | ---: | ---: | ---: |")
    full_sc = scored(niah_rec["full"])
    for l in labels:
        rec = niah_rec[l]
        s = scored(rec)
        if not s:
            reason = next((r["error"] for r in rec.values() if r.get("error")), "not run")
            p(f"| `{l}` | " + " | ".join("-" for _ in lengths) + f" | - | skipped: {reason} | - |")
            continue
        cells = []
        for L in lengths:
            ids = {i for i, r in rec.items() if r["meta"].get("length") == L}
            cells.append(fmt_pct(mean_score(rec, ids)))
        common = sorted(set(s) & set(full_sc))
        diff = "-" if l == "full" else fmt_diff(*paired([s[i] for i in common],
                                                        [full_sc[i] for i in common]))
        note = " †" if l in keeps_all else ""
        p(f"| `{l}`{note} | " + " | ".join(cells)
          + f" | {fmt_pct(mean_score(rec))} | {diff} | {fmt_share(kv_share(niah_store, l))} |")
    p("")
    if ruler:
        ruler_tables(p, ruler, ruler_rec, tasks, keeps_all,
                     lambda label: kv_share(ruler_store, label))
    # ---- discrimination (issue 12, point 3) ----
    p("**Discrimination** (two presses at the same budget ≥ 20 points apart on one task; gap "
      "with its paired 95% interval on the same samples; presses marked † excluded, they do not "
      "compress here):")
    p("")
    for b in budgets:
        best = None  # (gap, where, hi, lo, half, mean hi, mean lo, rank)
        candidates = []  # (benchmark, task, rec_of_label, labels)
        evicting = [l for l in labels if budget_of(l) == b and l not in keeps_all]
        candidates.append(("NIAH", "all cells", niah_rec, evicting, None))
        for t in tasks:  # none without --ruler
            candidates.append(("RULER", t, ruler_rec, evicting, t))
        for bench, tname, recs, labs, task in candidates:
            means = {}
            for l in labs:
                rec = recs.get(l, {})
                ids = task_ids(rec, task) if task else None
                m = mean_score(rec, ids)
                if m is not None:
                    means[l] = m
            if len(means) < 2:
                continue
            hi = max(means, key=means.get)
            lo = min(means, key=means.get)
            gap = means[hi] - means[lo]
            sh, sl = scored(recs[hi]), scored(recs[lo])
            ids = set(sh) & set(sl)
            if task:
                ids &= task_ids(recs[hi], task)
            ids = sorted(ids)
            _, half = paired([sh[i] for i in ids], [sl[i] for i in ids])
            # Prefer a gap >= 20 points whose interval excludes 0 (largest lower bound), then
            # the largest gap.
            lower = gap - half if half is not None else -1.0
            rank = (gap >= 0.2 and lower > 0, lower if gap >= 0.2 else -1.0, gap)
            if best is None or rank > best[-1]:
                best = (gap, f"{bench} {tname}", hi, lo, half, means[hi], means[lo], rank)
        if best is None:
            p(f"- budget {b}: fewer than two evicting presses scored.")
            continue
        gap, where, hi, lo, half, mh, ml, _ = best
        if gap < 0.2:
            verdict = "does NOT hold"
        elif half is not None and gap - half > 0:
            verdict = "holds (the gap's 95% interval excludes 0)"
        else:
            verdict = ("is reached by the means, but the gap's 95% interval includes 0: "
                       "not established")
        if gap == 0:
            p(f"- budget {b} ({100 * b / longest:.1f}%): every evicting press scored the same "
              f"on every task (NIAH: {100 * mh:.0f}%) — the ≥ 20-point bar does NOT hold at "
              "this budget.")
            continue
        interval = "" if half is None else f" ± {100 * half:.1f}"
        p(f"- budget {b} ({100 * b / longest:.1f}%): gap {100 * gap:.1f}{interval} "
          f"points, {where}: `{hi}` {100 * mh:.0f}% vs `{lo}` {100 * ml:.0f}% — the ≥ 20-point "
          f"bar {verdict} at this budget.")
    p("")
    if args.commands:
        p("Commands (`tools/longctx_tables.sh`, which ran them and wrote this block):")
        p("")
        p("```sh")
        with open(args.commands, encoding="utf-8") as f:
            p(f.read().rstrip())
        p("```")
        p("")
    block = "\n".join(out)
    if not args.readme:
        print(block)
        return
    with open(args.readme, encoding="utf-8") as f:
        text = f.read()
    begin = "<!-- longctx-tables: generated by tools/longctx_tables.sh, do not edit -->\n"
    end = "<!-- longctx-tables end -->"
    if begin not in text or end not in text:
        sys.exit(f"longctx_tables: no longctx-tables markers in {args.readme}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(args.readme, "w", encoding="utf-8") as f:
        f.write(head + begin + block + "\n" + end + tail)


if __name__ == "__main__":
    main()
