#!/usr/bin/env bash
# Regenerates the llama.cpp fixtures of tests/test_real_models.cpp on the two real models of
# tools/fetch_models.sh (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M), from the inputs in
# tests/data/real_models/inputs.json, into tests/data/real_models/<model>.json:
#   - tokenize: llama-tokenize --ids (the model's own BOS rule) of every text of
#     tests/data/tokenizer/hf_texts.json then inputs.json's "texts", with special tokens parsed
#     (the tool's default) and with --no-parse-special; and of the whole long_text file (its count
#     and the 64-bit FNV-1a of its ids joined by ",");
#   - chats: llama_chat_apply_template's rendering of every conversation (protokv-llama-oracle),
#     with the model's own template (SmolLM2: ChatML) or, for Gemma 3 whose file has none, the
#     built-in "gemma";
#   - greedy: 64 greedy tokens after each prompt (protokv-llama-oracle: F32 K/V, no flash
#     attention), with llama.cpp's runner-up token and top-1 minus top-2 logit margin at each
#     step; act_rounding and margin_rounding, how far llama.cpp on the model dequantised to F32
#     (llama-quantize --allow-requantize) is from it, teacher-forced (max |logit difference|, max
#     difference of the top-1 minus runner-up margin): the part of llama.cpp's result due to its
#     own rounding of activations, the basis of the test's tolerance; and how many steps llama.cpp
#     in llama-simple's own context (F16 K/V cache) keeps the same tokens (an F16 cache flips
#     near-ties), that run being checked against the stock llama-simple's output;
#   - perplexity: llama-perplexity -c 512 -b 512 on long_text, its running estimate per chunk and
#     its final estimate; and, for the record, its first 3 chunks with an F32 K/V cache and on the
#     model dequantised to F32.
#
#   tools/llama_cpp/make_real_model_fixtures.sh [smollm2|gemma3 ...]   # default: both
#
# Needs tools/llama_cpp/build.sh's llama.cpp (not part of CI), python3, and the models
# (tools/fetch_models.sh; PROTOKV_MODELS_DIR or ${PROTOKV_CACHE:-~/.cache/protokv}/models).
# Deterministic for a given llama.cpp build; takes about 15 minutes on 2 idle cores.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${PROTOKV_CACHE:-$HOME/.cache/protokv}
BIN=$CACHE/llama.cpp-build/bin
for tool in llama-tokenize llama-simple llama-perplexity llama-quantize protokv-llama-oracle; do
  [[ -x $BIN/$tool ]] || { echo "$0: $BIN/$tool missing: run tools/llama_cpp/build.sh" >&2; exit 1; }
done
MODELS_DIR=$(dirname "$("$ROOT/tools/fetch_models.sh" --quiet | head -1)")
COMMIT=$(git -C "$CACHE/llama.cpp-src" log -1 --format=%h 2>/dev/null || echo unknown)

python3 - "$ROOT" "$BIN" "$MODELS_DIR" "$COMMIT" "$@" <<'PY'
import hashlib, json, os, re, subprocess, sys, tempfile

root, bin_dir, models_dir, commit = sys.argv[1:5]
wanted = sys.argv[5:] or ["smollm2", "gemma3"]
MODELS = {  # name: (file, chat template for llama_chat_apply_template: "" = the file's own)
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", ""),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", "gemma"),
}
N_PREDICT, THREADS, PPL_CTX = 64, 2, 512
data = os.path.join(root, "tests", "data", "real_models")
inputs = json.load(open(os.path.join(data, "inputs.json"), encoding="utf-8"))
texts = json.load(open(os.path.join(root, "tests", "data", "tokenizer", "hf_texts.json"),
                       encoding="utf-8"))["texts"] + inputs["texts"]
long_file = inputs["long_text"]["file"]
long_bytes = open(long_file, "rb").read()
if hashlib.sha256(long_bytes).hexdigest() != inputs["long_text"]["sha256"]:
    sys.exit(f"{long_file}: sha256 differs from inputs.json's long_text")
tmp = tempfile.mkdtemp()


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, **kw)
    if r.returncode != 0:
        sys.stderr.write(r.stderr.decode("utf-8", "replace")[-3000:])
        sys.exit(f"failed: {' '.join(args[:4])} ...")
    return r.stdout.decode("utf-8", "replace")


def fnv1a64(data):
    """64-bit FNV-1a as a hex string: a hash the C++ test recomputes without a crypto library."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def tokenize(model, data_bytes, parse_special):
    path = os.path.join(tmp, "text.txt")
    open(path, "wb").write(data_bytes)
    args = [f"{bin_dir}/llama-tokenize", "-m", model, "-f", path, "--ids", "--no-escape",
            "--log-disable"]
    if not parse_special:
        args.append("--no-parse-special")
    line = [l for l in run(args).splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def oracle(model, job):
    path = os.path.join(tmp, "job.json")
    json.dump(job, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    return json.loads(run([f"{bin_dir}/protokv-llama-oracle", model, path]))


def prompt_text(prompt, chats):
    if "text" in prompt:
        return prompt["text"]
    if "chat" in prompt:
        return chats[prompt["chat"]]
    assert prompt["file"] == long_file
    return long_bytes[prompt["offset"]:prompt["offset"] + prompt["bytes"]].decode("utf-8")


def dump(value, indent=0):
    """JSON with every list of numbers on one line (readable diffs of id lists)."""
    pad = " " * indent
    if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
        return json.dumps(value)
    if isinstance(value, list):
        return "[\n" + ",\n".join(pad + " " + dump(v, indent + 1) for v in value) + "\n" + pad + "]"
    if isinstance(value, dict):
        items = [f'{pad} {json.dumps(k)}: {dump(v, indent + 1)}' for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return json.dumps(value, ensure_ascii=False)


for name in wanted:
    file, template = MODELS[name]
    model = os.path.join(models_dir, file)
    out = {
        "about": f"llama.cpp {commit} on {file}, made by tools/llama_cpp/make_real_model_fixtures.sh "
                 "from tests/data/real_models/inputs.json; do not edit",
        "llama_cpp": commit,
        "model": file,
        "model_bytes": os.path.getsize(model),
    }
    print(f"{name}: tokenizing {len(texts)} texts twice", file=sys.stderr)
    out["tokenize"] = {
        "texts": "tests/data/tokenizer/hf_texts.json texts, then inputs.json texts",
        "parse_special": [tokenize(model, t.encode("utf-8"), True) for t in texts],
        "no_parse_special": [tokenize(model, t.encode("utf-8"), False) for t in texts],
    }
    ids = tokenize(model, long_bytes, False)
    out["long_text"] = {
        "file": long_file, "bytes": len(long_bytes), "fnv1a64": fnv1a64(long_bytes),
        "parse_special": False, "tokens": len(ids), "first_ids": ids[:16],
        "ids_fnv1a64": fnv1a64(",".join(map(str, ids)).encode()),
    }

    print(f"{name}: chat templates", file=sys.stderr)
    rendered = oracle(model, {"chat_template": template, "chats": inputs["chats"]})["chats"]
    out["chat_template"] = template or "file"
    out["chats"] = rendered
    chats = {c["name"]: c["text"] for c in rendered}

    prompts = [p for p in inputs["greedy"] if name in p.get("models", [name])]
    # The model dequantised to F32: llama.cpp on it, teacher-forced on the same tokens, measures
    # how much of llama.cpp's logits is its own rounding of activations.
    dequantised = os.path.join(tmp, "f32.gguf")
    run([f"{bin_dir}/llama-quantize", "--allow-requantize", model, dequantised, "F32",
         str(THREADS)])
    job = {"n_predict": N_PREDICT, "threads": THREADS, "reference_model": dequantised,
           "greedy": [{"name": p["name"], "text": prompt_text(p, chats)} for p in prompts]}
    print(f"{name}: greedy on {len(prompts)} prompts", file=sys.stderr)
    greedy = oracle(model, job)["greedy"]
    # The same prompts in llama-simple's own context (F16 K/V cache, flash attention auto): the
    # stock llama-simple must print exactly that run's text (the oracle reproduces the tool), and
    # the step where it leaves the F32 run, with the F32 run's margin there, says how near a tie
    # llama.cpp's own cache rounding already flips.
    stock = oracle(model, dict(job, llama_simple_context=True, reference_model=""))["greedy"]
    os.remove(dequantised)
    for g, f16, p in zip(greedy, stock, job["greedy"]):
        simple = run([f"{bin_dir}/llama-simple", "-m", model, "-n", str(N_PREDICT), p["text"]])
        if simple != f16["simple_text"] + "\n":  # llama-simple ends with a newline
            sys.exit(f"{name} {g['name']}: llama-simple's text differs from the oracle's run "
                     "in llama-simple's context")
        same = next((i for i, (a, b) in enumerate(zip(g["ids"], f16["ids"])) if a != b),
                    min(len(g["ids"]), len(f16["ids"])))
        if same == len(g["ids"]) and len(f16["ids"]) == len(g["ids"]):
            note = "identical"
        else:
            note = f"departs at step {same} (F32 margin there {g['margins'][same]:.4f})"
        print(f"  {g['name']}: {len(g['prompt_ids'])} prompt tokens, {len(g['ids'])} generated, "
              f"min margin {min(g['margins']):.4f}, margin rounding {g['margin_rounding']:.4f}; "
              f"llama-simple (F16 cache) {note}", file=sys.stderr)
        g["f16_cache_same_steps"] = same
        if "file" not in next(q for q in prompts if q["name"] == g["name"]):
            g["text"] = p["text"]  # file slices are read from the file by the test
    out["greedy"] = [{k: g[k] for k in ("name", "text", "prompt_ids", "ids", "runner_up", "margins",
                                         "act_rounding", "margin_rounding",
                                         "f16_cache_same_steps") if k in g} for g in greedy]

    def perplexity(model_file, *extra):
        cmd = [f"{bin_dir}/llama-perplexity", "-m", model_file, "-f", long_file, "-c",
               str(PPL_CTX), "-b", str(PPL_CTX), "-t", str(THREADS), *extra]
        log = os.path.join(tmp, "ppl.log")
        with open(log, "wb") as f:  # a file: the last lines can be lost on a pipe
            subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True)
        text = open(log, encoding="utf-8", errors="replace").read()
        final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
        running = [float(v) for _, v in re.findall(r"\[(\d+)\]([0-9.]+),", text)]
        chunks = int(re.search(r"calculating perplexity over (\d+) chunks", text).group(1))
        assert final and len(running) == chunks, "unexpected llama-perplexity output"
        return running, float(final.group(1)), float(final.group(2))

    print(f"{name}: llama-perplexity", file=sys.stderr)
    running, ppl, error = perplexity(model)
    # llama.cpp's own spread on the first chunks, for the record (the test prints it): the same
    # file with an F32 K/V cache and no flash attention (protokv keeps K/V in F32), and the model
    # dequantised to F32 (no rounding of activations either, as protokv's prefill).
    f32_cache = perplexity(model, "--chunks", "3", "-ctk", "f32", "-ctv", "f32", "-fa", "off")[0]
    run([f"{bin_dir}/llama-quantize", "--allow-requantize", model, dequantised, "F32",
         str(THREADS)])
    exact = perplexity(dequantised, "--chunks", "3", "-ctk", "f32", "-ctv", "f32", "-fa", "off")[0]
    os.remove(dequantised)
    out["perplexity"] = {
        "command": "llama-perplexity -m MODEL -f " + long_file +
                   f" -c {PPL_CTX} -b {PPL_CTX} -t {THREADS}",
        "n_ctx": PPL_CTX, "chunks": len(running), "running_ppl": running,
        "ppl": ppl, "ppl_error": error,
        "running_ppl_f32_cache": f32_cache,
        "running_ppl_dequantised_f32": exact,
    }
    print(f"{name}: PPL {ppl} +/- {error} over {len(running)} chunks; first chunks {running[:3]}, "
          f"F32 cache {f32_cache}, dequantised F32 {exact}", file=sys.stderr)
    path = os.path.join(data, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump(out) + "\n")
    print(f"wrote {path}", file=sys.stderr)
PY
