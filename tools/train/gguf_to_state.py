# SPDX-License-Identifier: Apache-2.0
"""Reads a recall-model GGUF (as tools/train/ship.sh writes it) back into a training state.pt, so
that training can continue from shipped weights when the run's own state.pt is gone:

  /usr/bin/python3 tools/train/gguf_to_state.py models/protokv-recall.gguf /tmp/recall/s2/state.pt

The export path is train_recall.export_llama2c (llama2.c layout, Meta RoPE order) -> `protokv
convert --type f16` (no permutation: GGUF's llama layout is Meta order too) -> set_rope_base.py.
So the only transforms to undo are the tensor names and GGUF's reversed dimension order (ne[0]
is the row length; the data is row-major as torch's [out, in]); F16 matrices come back exactly
(F16 -> F32 is exact, and ship.sh's F32 -> F16 of them returns the same bits). The RoPE cos/sin
tables of the llama2.c file are not weights (the model recomputes them). Only numpy and torch.
Checks that the file's shape metadata matches train_recall.py's defaults (or the flags given).
"""

import argparse
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_recall import ROPE_THETA, Llama, export_llama2c  # noqa: E402

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types -> struct format of a scalar (8: string, 9: array).
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGML_F32, GGML_F16 = 0, 1

# GGUF tensor name -> (train_recall.Llama attribute, per layer)
LAYER_NAMES = {
    "attn_norm": "attn_norm",
    "attn_q": "wq",
    "attn_k": "wk",
    "attn_v": "wv",
    "attn_output": "wo",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "w1",
    "ffn_down": "w2",
    "ffn_up": "w3",
}


class Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def unpack(self, fmt):
        out = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return out[0]

    def string(self):
        n = self.unpack("<Q")
        s = self.data[self.at : self.at + n].decode("utf-8")
        self.at += n
        return s

    def value(self, vtype):
        if vtype in SCALARS:
            return self.unpack(SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.unpack("<I"), self.unpack("<Q")
            return [self.value(etype) for _ in range(n)]
        raise SystemExit(f"unknown GGUF metadata type {vtype}")


def read_gguf(path):
    """(metadata dict, {name: float32 numpy array in torch's [rows, cols] order})."""
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != GGUF_MAGIC:
        raise SystemExit(f"{path}: not a GGUF file")
    r.at = 4
    version = r.unpack("<I")
    if version not in (2, 3):
        raise SystemExit(f"{path}: GGUF version {version} (expected 2 or 3)")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        dims = [r.unpack("<Q") for _ in range(n_dims)]
        ttype, offset = r.unpack("<I"), r.unpack("<Q")
        infos.append((name, dims, ttype, offset))
    align = meta.get("general.alignment", 32)
    base = (r.at + align - 1) // align * align
    tensors = {}
    for name, dims, ttype, offset in infos:
        count = int(np.prod(dims))
        if ttype == GGML_F32:
            arr = np.frombuffer(data, np.float32, count, base + offset)
        elif ttype == GGML_F16:
            arr = np.frombuffer(data, np.float16, count, base + offset).astype(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has type {ttype}; only F32/F16 files are read")
        tensors[name] = arr.reshape(list(reversed(dims))).copy()  # ne[0] is the fastest axis
    return meta, tensors


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf")
    p.add_argument("state")
    p.add_argument("--llama2c", default="", help="also write the llama2.c export (recall.bin) of the read weights, "
                   "for the round trip: ship.sh on it must give the same GGUF bytes")
    a = p.parse_args()
    meta, tensors = read_gguf(a.gguf)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise SystemExit(f"{a.gguf}: architecture {arch}, expected llama")
    cfg = argparse.Namespace(
        dim=meta["llama.embedding_length"],
        hidden_dim=meta["llama.feed_forward_length"],
        n_layers=meta["llama.block_count"],
        n_heads=meta["llama.attention.head_count"],
        n_kv_heads=meta["llama.attention.head_count_kv"],
        context=meta["llama.context_length"],
        rope_theta=meta.get("llama.rope.freq_base", ROPE_THETA),
        vocab=meta.get("llama.vocab_size", tensors["token_embd.weight"].shape[0]),
    )
    model = Llama(cfg)
    state = model.state_dict()
    mapping = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight",
               "output.weight": "output.weight"}
    for i in range(cfg.n_layers):
        for g, t in LAYER_NAMES.items():
            mapping[f"blk.{i}.{g}.weight"] = f"layers.{i}.{t}.weight"
    missing = set(state) - set(mapping.values())
    if missing or set(tensors) != set(mapping):
        raise SystemExit(f"{a.gguf}: tensors {sorted(tensors)} do not match the model ({sorted(missing)} unmapped)")
    for g, t in mapping.items():
        if tuple(state[t].shape) != tensors[g].shape:
            raise SystemExit(f"{a.gguf}: {g} has shape {tensors[g].shape}, the model wants {tuple(state[t].shape)}")
        state[t] = torch.from_numpy(tensors[g])
    model.load_state_dict(state)
    os.makedirs(os.path.dirname(os.path.abspath(a.state)), exist_ok=True)
    torch.save({"model": model.state_dict(), "step": 0, "from_gguf": os.path.abspath(a.gguf)}, a.state)
    if a.llama2c:
        export_llama2c(model, cfg, a.llama2c)
    print(f"{a.gguf} -> {a.state}: {sum(v.numel() for v in state.values())} parameters, "
          f"rope base {cfg.rope_theta:g}, context {cfg.context}")


if __name__ == "__main__":
    main()
