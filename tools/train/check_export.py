# SPDX-License-Identifier: Apache-2.0
"""Checks that protokv runs the exported model exactly as torch does: greedy continuations of a
few prompts must be the same token ids.

  /usr/bin/python3 tools/train/check_export.py --state /tmp/recall/state.pt \
      --protokv build/protokv --work /tmp/recall/check

Without --state, a random model with large weights (decisive logits) is checked.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tok512 import Tok512  # noqa: E402
from train_recall import ROPE_THETA, Llama, export_llama2c  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state", default="")
    p.add_argument("--protokv", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tokenizer", default="/work/shared/models/stories260K/tok512.bin")
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--hidden-dim", type=int, default=384)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-kv-heads", type=int, default=2)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=ROPE_THETA)
    a = p.parse_args()
    a.vocab = 512
    torch.manual_seed(0)
    model = Llama(a)
    if a.state:
        model.load_state_dict(torch.load(a.state)["model"])
    else:
        with torch.no_grad():
            for prm in model.parameters():
                if prm.dim() == 2:
                    prm.mul_(10.0)
    model.eval()
    os.makedirs(a.work, exist_ok=True)
    bin_path = os.path.join(a.work, "model.bin")
    gguf = os.path.join(a.work, "model.gguf")
    export_llama2c(model, a, bin_path)
    subprocess.run([a.protokv, "convert", bin_path, a.tokenizer, "-o", gguf], check=True, capture_output=True)
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "set_rope_base.py"), gguf, str(a.rope_theta)], check=True)
    tok = Tok512(a.tokenizer)
    prompts = [
        "Once upon a time",
        " ".join(["The grass is green. The sky is blue. The sun is yellow."] * 40),
        "The special magic number for golden-zebra is 4829103. The grass is green. The sky is blue."
        "\nWhat is the special magic number for golden-zebra? The special magic number for golden-zebra is",
    ]
    failures = 0
    for prompt in prompts:
        ids = [tok.bos_id] + tok.encode(prompt)
        with torch.no_grad():
            for _ in range(a.tokens):
                ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
        want = ids[-a.tokens :]
        res = subprocess.run(
            [a.protokv, "generate", "-m", gguf, "-p", prompt, "-n", str(a.tokens), "--temp", "0", "--json"],
            check=True, capture_output=True, text=True)
        got = json.loads(res.stdout)
        got_ids = got["generated_tokens"]
        same = got_ids == want
        failures += not same
        print(f"{'same' if same else 'DIFFERENT'}: torch {want}\n      protokv {got_ids}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
