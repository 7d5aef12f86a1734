# SPDX-License-Identifier: Apache-2.0
"""SentencePiece-style BPE encoder for a llama2.c tokenizer.bin (stories260K's tok512).

Reproduces protokv's encoder (src/tokenizer/tokenizer.cpp, encode_spm with llama2.c
compatibility): a dummy-prefix space, spaces become U+2581, then the best-scoring adjacent pair
is merged repeatedly (ties: leftmost); characters without a piece fall back to byte tokens that
never merge. Words (runs starting at a U+2581 that does not follow another) are encoded
independently and cached, as protokv does when no piece holds an inner U+2581.
check_against_protokv() compares with `protokv tokenize` so a mismatch cannot go unnoticed.
"""

import heapq
import struct

SPACE = "\u2581"


class Tok512:
    def __init__(self, path):
        with open(path, "rb") as f:
            data = f.read()
        (self.max_len,) = struct.unpack_from("<i", data, 0)
        off = 4
        self.pieces, self.scores = [], []
        while off < len(data):
            score, n = struct.unpack_from("<fi", data, off)
            off += 8
            raw = data[off : off + n]
            off += n
            self.pieces.append(raw)
            self.scores.append(score)
        self.byte_ids = {}
        self.index = {}
        for i, raw in enumerate(self.pieces):
            text = raw.decode("utf-8", errors="replace")
            if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                self.byte_ids[int(text[3:5], 16)] = i
                continue
            # llama2.c exports "\u2581" as a plain space.
            self.index.setdefault(text.replace(" ", SPACE), i)
        self.bos_id, self.eos_id = 1, 2
        self.inner_space = any(SPACE in p[1:] for p in self.index)
        self._cache = {}

    def _segment(self, seg):
        cached = self._cache.get(seg)
        if cached is not None:
            return cached
        # symbols: [text, id, mergeable]
        syms = []
        for ch in seg:
            pid = self.index.get(ch)
            if pid is not None:
                syms.append([ch, pid, True])
            else:
                for b in ch.encode("utf-8"):
                    syms.append([None, self.byte_ids[b], False])
        prev = list(range(-1, len(syms) - 1))
        nxt = list(range(1, len(syms) + 1))
        if syms:
            nxt[-1] = -1
        alive = [True] * len(syms)
        heap = []

        def consider(i):
            if i < 0:
                return
            j = nxt[i]
            if j < 0:
                return
            a, b = syms[i], syms[j]
            if not (a[2] and b[2]):
                return
            merged = a[0] + b[0]
            pid = self.index.get(merged)
            if pid is None:
                return
            heapq.heappush(heap, (-self.scores[pid], i, j, merged, pid))

        for i in range(len(syms) - 1):
            consider(i)
        while heap:
            _, i, j, merged, pid = heapq.heappop(heap)
            if not (alive[i] and alive[j]) or nxt[i] != j or syms[i][0] + syms[j][0] != merged:
                continue
            syms[i] = [merged, pid, True]
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prev[nxt[j]] = i
            consider(prev[i])
            consider(i)
        out = [s[1] for k, s in enumerate(syms) if alive[k]]
        self._cache[seg] = out
        return out

    def encode(self, text, bos=False):
        norm = SPACE + text.replace(" ", SPACE)
        out = [self.bos_id] if bos else []
        if self.inner_space:
            return out + self._segment(norm)
        start = 0
        pos = norm.find(SPACE, 1)
        while pos != -1:
            if norm[pos - 1] != SPACE:
                out += self._segment(norm[start:pos])
                start = pos
            pos = norm.find(SPACE, pos + 1)
        out += self._segment(norm[start:])
        return out

    def decode_piece(self, tid):
        raw = self.pieces[tid]
        return raw.decode("utf-8", errors="replace")


def check_against_protokv(tok, protokv, gguf, texts):
    """Asserts that tok.encode(text) equals `protokv tokenize` for every text."""
    import json
    import subprocess

    for text in texts:
        res = subprocess.run(
            [protokv, "tokenize", "-m", gguf, "-p", text, "--json"],
            check=True,
            capture_output=True,
            text=True,
        )
        want = json.loads(res.stdout)["ids"]
        got = tok.encode(text)
        if want != got:
            raise SystemExit(f"tokenizer mismatch on {text[:60]!r}: {got[:20]} vs {want[:20]}")
