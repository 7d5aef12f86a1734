# SPDX-License-Identifier: Apache-2.0
"""Train protokv's recall model: a small Llama (RMSNorm, RoPE in Meta adjacent-pair order, GQA,
SwiGLU) on planted-fact retrieval in the formats of `protokv eval niah` / `eval ruler`.

CPU, Debian's python3-torch 1.13 (apt-get install python3-torch; run with /usr/bin/python3):

  /usr/bin/python3 tools/train/train_recall.py --out /tmp/recall --minutes 70 \
      --stories /tmp/recall/stories.txt

The curriculum is timed (a fraction of --minutes per context length), so the run ends on time
whatever the machine's speed; the model is exported every --checkpoint-minutes as a llama2.c
checkpoint (`recall.bin`), which `protokv convert recall.bin tok512.bin -o model.gguf` turns into
a GGUF (llama2.c files use Meta RoPE order, as this model); `set_rope_base.py model.gguf 500000`
then writes the RoPE base (llama.rope.freq_base), which llama2.c files cannot carry.
Each log line: step, minutes, context, tokens seen, LM loss, answer loss, answer-token accuracy;
with --eval-every, held-out probes (see HeldOut). The recipe that makes retrieval emerge on a CPU
(--induction-init, then a length curriculum) and its two commands are in models/protokv-recall.md.
"""

import argparse
import json
import math
import os
import random
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recall_data import DOC_KINDS, NIAH_QUESTION, RecallData, parse_mix  # noqa: E402
from tok512 import Tok512  # noqa: E402

# RoPE base: 500000 (Llama 3's). With head_dim 32, base 10000 leaves only 2 rotation pairs
# that turn less than a radian over 2048 tokens, too few to match content at that distance; the
# llama2.c format has no theta field, so set_rope_base.py writes it into the converted GGUF.
ROPE_THETA = 500000.0
NORM_EPS = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


def rope_tables(head_dim, n, rope_theta=ROPE_THETA):
    inv = rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)  # [n, head_dim / 2]


def rotate_by_positions(vec, steps, rope_theta=ROPE_THETA):
    """vec [head_dim] rotated as RoPE (Meta order) rotates a vector `steps` positions on."""
    head_dim = vec.shape[0]
    inv = rope_theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    out = vec.clone()
    for i in range(head_dim // 2):
        c, sn = math.cos(steps * inv[i]), math.sin(steps * inv[i])
        out[2 * i] = vec[2 * i] * c - vec[2 * i + 1] * sn
        out[2 * i + 1] = vec[2 * i] * sn + vec[2 * i + 1] * c
    return out


def apply_rope(x, cos, sin):
    # Meta order: rotate the pairs (2i, 2i + 1), as llama2.c and protokv's rope_neox = false.
    x0, x1 = x[..., 0::2], x[..., 1::2]
    r0 = x0 * cos - x1 * sin
    r1 = x0 * sin + x1 * cos
    return torch.stack((r0, r1), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = a.n_heads, a.n_kv_heads, a.dim // a.n_heads
        self.attn_norm = RMSNorm(a.dim)
        self.wq = nn.Linear(a.dim, a.dim, bias=False)
        self.wk = nn.Linear(a.dim, self.n_kv * self.hd, bias=False)
        self.wv = nn.Linear(a.dim, self.n_kv * self.hd, bias=False)
        self.wo = nn.Linear(a.dim, a.dim, bias=False)
        self.ffn_norm = RMSNorm(a.dim)
        self.w1 = nn.Linear(a.dim, a.hidden_dim, bias=False)  # gate
        self.w2 = nn.Linear(a.hidden_dim, a.dim, bias=False)  # down
        self.w3 = nn.Linear(a.dim, a.hidden_dim, bias=False)  # up

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.n_heads, self.hd)
        k = self.wk(h).view(b, t, self.n_kv, self.hd)
        v = self.wv(h).view(b, t, self.n_kv, self.hd)
        q, k = apply_rope(q, cos[:, None, :], sin[:, None, :]), apply_rope(k, cos[:, None, :], sin[:, None, :])
        rep = self.n_heads // self.n_kv  # query head h reads KV head h // rep
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        y = F.softmax(att, dim=-1) @ v
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * a.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        t = idx.shape[1]
        cos, sin = rope_tables(self.a.dim // self.a.n_heads, t, self.a.rope_theta)
        cos, sin = cos.to(idx.device), sin.to(idx.device)
        mask = torch.full((t, t), float("-inf"), device=idx.device).triu(1)
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output(self.norm(x))


def previous_token_init(model, a):
    """Structured start (optional): layer 0's query heads 0 and 1 (KV head 0) attend to the
    previous token and the one before it, through a constant embedding channel and RoPE, so
    that induction (copy) heads in layer 1 can form without waiting for these to emerge.
    Score(m, n) = q^T R(n - m) k with q = s u, k = s R(1) u: largest at n = m - 1 (head 0) and,
    with q = s R(-1) u, at n = m - 2 (head 1). u lives on the three fastest rotation pairs."""
    hd = a.dim // a.n_heads
    const = a.dim - 1  # the constant channel
    with torch.no_grad():
        model.tok_embeddings.weight[:, const] = 1.0

        def rot(vec, steps):
            return rotate_by_positions(vec, steps, a.rope_theta)

        u = torch.zeros(hd)
        u[0:6:2] = 1.0  # pairs 0, 1, 2
        layer = model.layers[0]
        # After RMSNorm the constant channel is ~sqrt(dim) (it dominates the embedding's norm).
        scale = 3.0 / math.sqrt(a.dim) * hd**0.25
        layer.wq.weight[:, const] = 0.0
        layer.wk.weight[:, const] = 0.0
        layer.wq.weight[0:hd, const] = scale * u
        layer.wq.weight[hd : 2 * hd, const] = scale * rot(u, -1)
        layer.wk.weight[0:hd, const] = scale * rot(u, 1)
        for w in (layer.wq.weight[0 : 2 * hd, :const], layer.wk.weight[0:hd, :const]):
            w.zero_()
        layer.wv.weight[0:hd, :const] = torch.randn(hd, const) / math.sqrt(const) * 4
        layer.wo.weight[:, 0 : 2 * hd] = torch.randn(a.dim, 2 * hd) / math.sqrt(2 * hd)


def induction_init(model, a, slow_pair=8, seed=0):
    """Structured start (optional, stronger than previous_token_init): a whole induction
    circuit wired at initialisation, which training then reshapes into key matching.
    Subspaces of the residual: A = dims [0, dim - 1 - hd) the token embedding, B = the next hd
    dims the previous token's identity, dim - 1 a constant channel.
    Layer 0, query head 0: attends to the previous token (constant channel through RoPE, as
    previous_token_init) and writes R e(t - 1) into B (R: random hd x |A| projection).
    Layer 1, query head 0: query R e(t), key B, both on the slow RoPE pairs (>= slow_pair,
    which turn < 1 radian over a few hundred tokens), so it attends to the positions that
    follow an earlier occurrence of the current token; its value R2 e(s) goes back into A as
    R2^T R2 e(s), and the classifier starts tied to the embedding, so that token's logit rises."""
    g = torch.Generator().manual_seed(seed)
    d, hd = a.dim, a.dim // a.n_heads
    const = d - 1
    A = slice(0, d - 1 - hd)
    B = slice(d - 1 - hd, d - 1)
    na = d - 1 - hd

    def rot(vec, steps):
        return rotate_by_positions(vec, steps, a.rope_theta)

    with torch.no_grad():
        emb = model.tok_embeddings.weight
        emb.zero_()
        emb[:, A] = torch.randn(emb.shape[0], na, generator=g) / math.sqrt(na)
        emb[:, const] = 1.0
        model.output.weight.zero_()
        model.output.weight[:, A] = emb[:, A] * 2.0
        R = torch.randn(hd, na, generator=g) / math.sqrt(na) * math.sqrt(hd)  # |R e| ~ |e| sqrt(hd / na)
        R2 = torch.randn(hd, na, generator=g) / math.sqrt(na) * math.sqrt(hd)
        # Layer 0, head 0: previous token (score peaks at offset 1), value R e -> B.
        l0 = model.layers[0]
        u = torch.zeros(hd)
        u[0:6:2] = 1.0
        scale = 3.0 / math.sqrt(d) * hd**0.25 * math.sqrt(2.0)  # const channel ~ sqrt(d / 2) after the norm
        for w in (l0.wq.weight[0:hd], l0.wk.weight[0:hd], l0.wv.weight[0:hd]):
            w.zero_()
        l0.wq.weight[0:hd, const] = scale * u
        l0.wk.weight[0:hd, const] = scale * rot(u, 1)
        l0.wv.weight[0:hd, A] = R
        l0.wo.weight[:, 0 : 2 * hd] = 0.0  # heads 0 and 1 share KV head 0; only head 0 writes
        l0.wo.weight[B, 0:hd] = torch.eye(hd)
        # Layer 1, head 0: match R e(t) against B on the slow pairs; copy R2 e(s) into A.
        l1 = model.layers[1]
        slow = torch.arange(2 * slow_pair, hd)
        for w in (l1.wq.weight[0:hd], l1.wk.weight[0:hd], l1.wv.weight[0:hd]):
            w.zero_()
        beta = 2.0
        l1.wq.weight[slow, A] = R[slow] * beta
        l1.wk.weight[slow, B.start + slow] = beta
        l1.wv.weight[0:hd, A] = R2
        l1.wo.weight[:, 0 : 2 * hd] = 0.0
        l1.wo.weight[A, 0:hd] = R2.t() * 2.0


def export_llama2c(model, a, path):
    """llama2.c legacy checkpoint (run.c's memory_map_weights order), separate classifier
    (negative vocab size), F32."""
    L = model.layers
    tensors = [model.tok_embeddings.weight]
    for attr in ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3"):
        tensors.append(torch.stack([getattr(l, attr).weight for l in L]))
    tensors.append(model.norm.weight)
    cos, sin = rope_tables(a.dim // a.n_heads, a.context, a.rope_theta)
    tensors += [cos, sin, model.output.weight]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<7i", a.dim, a.hidden_dim, a.n_layers, a.n_heads, a.n_kv_heads, -a.vocab, a.context))
        for t in tensors:
            f.write(t.detach().float().cpu().contiguous().numpy().tobytes())
    os.replace(tmp, path)


DEFAULT_SCHEDULE = "256x8:0.30,512x4:0.60,1024x2:0.82,2048x1:1.0"


def parse_schedule(text):
    """"256x8:0.3,512x4:1.0" -> [(end fraction, context, batch)]: short contexts first."""
    out = []
    for part in text.split(","):
        shape, _, end = part.partition(":")
        ctx, _, batch = shape.partition("x")
        out.append((float(end), int(ctx), int(batch)))
    if not out or any(b[0] <= a[0] for a, b in zip(out, out[1:])):
        raise ValueError(f"schedule '{text}': end fractions must increase")
    return out


def schedule(frac, stages):
    """(context, batch) for the elapsed fraction of the run."""
    for end, ctx, batch in stages:
        if frac < end:
            return ctx, batch
    return stages[-1][1], stages[-1][2]


class HeldOut:
    """Learning-curve probes on rows the training stream never draws (seed + 7919):
    teacher-forced accuracy on the answer tokens that carry information (digits, keys: not the
    template's "▁", "." or ","), per document kind; and exact match of greedy answers to
    single-needle `eval niah` questions (needle at a random depth in the eval's haystacks)."""

    def __init__(self, a, tok, kinds, ctx, rows_per_kind=8, niah_rows=12):
        data = RecallData(tok, a.words, a.stories, a.seed + 7919, mix={"niah": 1.0})
        self.tok = tok
        trivial = {i for i, p in enumerate(tok.pieces) if p.strip() in (b"", b".", b",")}
        self.sets = {}
        for kind in kinds:
            rows = []
            for _ in range(rows_per_kind):
                spans = data.kind_doc(kind, ctx)
                t = sum((x for x, _ in spans), [])[: ctx + 1]
                f = sum(([af] * len(x) for x, af in spans), [])[: ctx + 1]
                f = [af and tt not in trivial for tt, af in zip(t, f)]
                rows.append((t, f))
            self.sets[kind] = rows
        self.niah = []
        while len(self.niah) < niah_rows:
            spans = data.niah_doc(ctx)
            needles = [x for x, _ in spans if x[:3] == tok.encode("The special magic")[:3]]
            if len(needles) != 1:
                continue
            # Prompt: everything up to the first answer; the expected answer is its digits.
            t, ans = [], None
            for x, af in spans:
                if af:
                    ans = x
                    break
                t += x
            self.niah.append((t, ans))

    @torch.no_grad()
    def measure(self, model, device):
        model.eval()
        out = {}
        for kind, rows in self.sets.items():
            hit = n = 0
            for t, f in rows:
                x = torch.tensor([t], device=device)
                pred = model(x[:, :-1]).argmax(-1)[0]
                m = torch.tensor(f[1:], device=device)
                hit += (pred[m] == x[0, 1:][m]).sum().item()
                n += m.sum().item()
            out["acc_" + kind] = round(hit / max(1, n), 4)
        exact = 0
        for t, ans in self.niah:
            x = torch.tensor([t], device=device)
            got = []
            for _ in range(len(ans)):
                nxt = model(x)[0, -1].argmax().item()
                got.append(nxt)
                x = torch.cat([x, torch.tensor([[nxt]], device=device)], 1)
            exact += got == ans
        out["niah_exact"] = f"{exact}/{len(self.niah)}"
        model.train()
        return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--stories", required=True, help="filler text (stories written by stories260K)")
    p.add_argument("--tokenizer", default="/work/shared/models/stories260K/tok512.bin")
    p.add_argument("--words", default=os.path.join(os.path.dirname(__file__), "../../src/eval/longctx_words.cpp"))
    p.add_argument("--minutes", type=float, default=70.0)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time only)")
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    p.add_argument("--keep-checkpoints", action="store_true", help="also keep every checkpoint as recall_stepN.bin")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine (same recipe, minutes)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--hidden-dim", type=int, default=384)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--n-kv-heads", type=int, default=2)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=ROPE_THETA)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine",
                   help="after warm-up: cosine to 10%% over the run's time, or constant (probes)")
    p.add_argument("--answer-weight", type=float, default=1.0)
    p.add_argument("--lm-weight", type=float, default=1.0, help="weight of the mean loss on non-answer tokens")
    p.add_argument("--mix", default="", help="document shares, e.g. copy=0.3,mqar=0.3,niah=0.4 (kinds: "
                   + ", ".join(DOC_KINDS) + "); default: the first recipe's")
    p.add_argument("--schedule", default=DEFAULT_SCHEDULE, help="CTXxBATCH:END_FRACTION,... (timed curriculum)")
    p.add_argument("--init-from", default="", help="state.pt to start from (continue a probe)")
    p.add_argument("--eval-every", type=int, default=0, help="held-out probes every N steps, a multiple of 10 (0: never)")
    p.add_argument("--eval-ctx", type=int, default=256)
    p.add_argument("--prev-token-init", action="store_true", help="structured start, see previous_token_init")
    p.add_argument("--induction-init", action="store_true", help="structured start, see induction_init")
    p.add_argument("--copy-share", type=float, default=0.0, help="share of induction-drill documents")
    p.add_argument("--schedule-scale", type=float, default=1.0, help="context lengths x this (probes)")
    a = p.parse_args()
    a.vocab = 512
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    tok = Tok512(a.tokenizer)
    mix = parse_mix(a.mix) if a.mix else None
    stages = parse_schedule(a.schedule)
    data = RecallData(tok, a.words, a.stories, a.seed, a.copy_share, mix)
    model = Llama(a)
    if a.prev_token_init:
        previous_token_init(model, a)
    if a.induction_init:
        induction_init(model, a)
    if a.init_from:
        model.load_state_dict(torch.load(a.init_from, map_location="cpu")["model"])
    held = None
    if a.eval_every:
        kinds = sorted(set(mix or {}) - {"lm"} | {"niah"})
        held = HeldOut(a, tok, kinds, a.eval_ctx)
    model = model.to(a.device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    log = open(os.path.join(a.out, "train_log.jsonl"), "a")
    print(f"params {n_params} config {vars(a)}", flush=True)
    t0 = time.time()
    last_ckpt = t0
    step, seen = 0, 0
    while True:
        elapsed = time.time() - t0
        frac = elapsed / (a.minutes * 60)
        if frac >= 1.0 or (a.max_steps and step >= a.max_steps):
            break
        ctx, batch = schedule(frac, stages)
        ctx = max(64, int(ctx * a.schedule_scale))
        rows = [data.row(ctx) for _ in range(batch)]
        x = torch.tensor([r[0] for r in rows], device=a.device)
        ans = torch.tensor([r[1] for r in rows], device=a.device)[:, 1:]
        lr = a.lr * min(1.0, (step + 1) / a.warmup)
        if a.lr_schedule == "cosine":
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(x[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, a.vocab), x[:, 1:].reshape(-1), reduction="none").view_as(ans.float())
        lm_loss = ce[~ans].mean()
        ans_loss = ce[ans].mean() if ans.any() else torch.zeros(())
        loss = a.lm_weight * lm_loss + a.answer_weight * ans_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += batch * ctx
        if step % 10 == 0 or step == 1:
            with torch.no_grad():
                pred = logits.argmax(-1)
                acc = (pred[ans] == x[:, 1:][ans]).float().mean().item() if ans.any() else float("nan")
            rec = {"step": step, "min": round((time.time() - t0) / 60, 2), "ctx": ctx, "tokens": seen,
                   "lm_loss": round(lm_loss.item(), 4), "ans_loss": round(ans_loss.item(), 4),
                   "ans_acc": round(acc, 4), "lr": round(lr, 6)}
            if held and (step % a.eval_every == 0 or step == 1):
                rec.update(held.measure(model, a.device))
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(rec, flush=True)
        if time.time() - last_ckpt > a.checkpoint_minutes * 60:
            export_llama2c(model, a, os.path.join(a.out, "recall.bin"))
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(a.out, "state.pt"))
            if a.keep_checkpoints:  # every checkpoint kept, to pick the best one afterwards
                export_llama2c(model, a, os.path.join(a.out, f"recall_step{step}.bin"))
            last_ckpt = time.time()
    export_llama2c(model, a, os.path.join(a.out, "recall.bin"))
    torch.save({"model": model.state_dict(), "step": step}, os.path.join(a.out, "state.pt"))
    print(f"done: {step} steps, {seen} tokens, {(time.time() - t0) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
