# SPDX-License-Identifier: Apache-2.0
"""Seeded training data for the recall model: planted facts and questions in the formats of
protokv's `eval niah` (src/eval/niah.cpp) and `eval ruler` (src/eval/ruler.cpp), hidden in
language filler (stories written by stories260K) or RULER's repeated noise sentences, plus a
language-modelling share.

Supervision is dense: a document plants several facts and asks several questions, each followed
by its answer; answer tokens are marked so the loss can weight them. Documents of varied length
are packed into fixed-length rows (BOS starts every document).
"""

import random
import re

NIAH_NEEDLE = "The special magic number for {key} is {value}."
NIAH_QUESTION = "\nWhat is the special magic number for {key}? The special magic number for {key} is"
RULER_NOISE = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
RULER_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
RULER_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
    "the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
RULER_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following "
    "text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the "
    "text above."
)
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assgined the value {query}, they are: "
)
VT_NOISE = RULER_NOISE + "\n"


def ruler_question(type_v, queries, values_per_query):
    """The text before and after {context} of RULER's niah template, and the word the answer
    follows; singular wording when one value is asked for (as src/eval/ruler.cpp does)."""
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    templ = RULER_TEMPLATE + RULER_ANSWER_PREFIX
    tv = type_v
    if len(queries) * values_per_query == 1:
        templ = templ.replace("Some", "A").replace("are all", "is").replace("are", "is")
        tv = type_v[:-1]
    at = templ.find("{context}")
    before = templ[:at].format(type_needle_v=tv)
    after = templ[at + 9 :].format(type_needle_v=tv, query=query)
    return before, after, after.split()[-1]


def read_word_lists(cpp_path):
    """The key words of protokv's long-context tasks, read from src/eval/longctx_words.cpp so
    training and evaluation draw keys from the same lists."""
    text = open(cpp_path, encoding="utf-8").read()
    lists = {}
    for name in ("kNouns", "kAdjectives", "kVerbs"):
        m = re.search(name + r"\s*=\s*\{(.*?)\};", text, re.S)
        lists[name] = re.findall(r'"([^"]+)"', m.group(1))
    return lists


# Document kinds and their default shares (the recipe of the first shipped model, which did
# not retrieve); --mix in train_recall.py overrides them.
DEFAULT_MIX = {"niah": 0.38, "ruler": 0.42, "vt": 0.10, "lm": 0.10}
DOC_KINDS = ("copy", "mqar", "dense", "niah", "ruler", "rtask", "vt", "vtx", "lm")

# `eval ruler`'s niah task table (src/eval/ruler.cpp niah_tasks, RULER's synthetic.yaml):
# haystack, key type, value type, keys, values per key, queries.
RULER_TASKS = {
    "niah_single_1": ("repeat", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 1, 1, 4),
}
# Task shares of the `rtask` kind (stage 3: weighted toward the tasks the stage-2 model failed).
DEFAULT_RTASK_MIX = {
    "niah_single_1": 0.05,
    "niah_single_2": 0.05,
    "niah_single_3": 0.05,
    "niah_multikey_1": 0.15,
    "niah_multikey_2": 0.1,
    "niah_multikey_3": 0.3,
    "niah_multivalue": 0.2,
    "niah_multiquery": 0.1,
}


def parse_mix(text):
    """"copy=0.3,mqar=0.2,niah=0.5" -> shares normalised to 1."""
    mix = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        name = name.strip()
        if name not in DOC_KINDS:
            raise ValueError(f"unknown document kind '{name}' (kinds: {', '.join(DOC_KINDS)})")
        mix[name] = float(share)
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("mix shares must sum to more than 0")
    return {k: v / total for k, v in mix.items()}


class RecallData:
    def __init__(self, tok, words_cpp, stories_path, seed, copy_share=0.0, mix=None, rtask_mix=None):
        self.tok = tok
        self.rtask_mix = rtask_mix or DEFAULT_RTASK_MIX
        self.copy_share = copy_share
        self.mix = mix  # None: the original draw order (copy_share, then DEFAULT_MIX)
        self.rng = random.Random(seed)
        w = read_word_lists(words_cpp)
        self.keys = sorted({f"{a}-{n}" for a in w["kAdjectives"] for n in w["kNouns"]})
        stories = open(stories_path, encoding="utf-8").read()
        self.story_sents = [s for s in re.split(r"(?<=\.)\s+", stories) if 3 < len(s) < 400]
        self.story_sents = [s.replace("\n", " ").strip() for s in self.story_sents]
        self.noise_unit = tok.encode(RULER_NOISE)
        self.newline = tok.encode("\n")[-1:]
        self.dot_ids = {i for i, p in enumerate(tok.pieces) if b"." in p}
        # Single-token keys and values for the MQAR drill: the non-byte, non-digit pieces.
        self.digit_ids = [i for i, p in enumerate(tok.pieces) if p.isdigit() and len(p) == 1]
        byte_ids = set(tok.byte_ids.values())
        self.word_ids = [i for i in range(3, len(tok.pieces)) if i not in byte_ids and i not in self.digit_ids]

    # -- random draws (RULER's value formats) --
    def number(self):
        return str(self.rng.randint(1000000, 9999999))

    def uuid(self):
        h = "%032x" % self.rng.getrandbits(128)
        h = h[:12] + "4" + h[13:16] + "89ab"[self.rng.randrange(4)] + h[17:]
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def key(self):
        return self.rng.choice(self.keys)

    def distinct(self, draw, k):
        out = []
        while len(out) < k:
            v = draw()
            if v not in out:
                out.append(v)
        return out

    def story_text(self, approx_tokens):
        """Consecutive sentences of the stories corpus, about approx_tokens long (~4.2 chars/token
        with tok512)."""
        i = self.rng.randrange(len(self.story_sents))
        out, chars = [], 0
        while chars < approx_tokens * 3.2:
            out.append(self.story_sents[i % len(self.story_sents)])
            chars += len(out[-1]) + 1
            i += 1
        return out

    def answer_tokens(self, prefix_word, answer_text):
        """Tokens of answer_text as they follow prefix_word (so the leading space is tokenized as
        in the needle sentence)."""
        base = self.tok.encode(prefix_word)
        full = self.tok.encode(prefix_word + answer_text)
        assert full[: len(base)] == base
        return full[len(base) :]

    # -- documents: list of (tokens, is_answer) spans; the first token is BOS --
    def niah_doc(self, length):
        """`eval niah` layout: BOS, haystack with needles at sentence boundaries, then questions
        in the eval's wording, each followed by its answer."""
        tok = self.tok
        k = min(self.rng.choice([1, 1, 2, 3, 4, 6, 8]), max(1, (length - 40) // 120))
        keys = self.distinct(self.key, k)
        values = [self.number() for _ in keys]
        needles = [tok.encode(NIAH_NEEDLE.format(key=a, value=v)) for a, v in zip(keys, values)]
        order = list(range(k))
        self.rng.shuffle(order)
        n_q = self.rng.randint(1, k)
        qa = []
        for i in order[:n_q]:
            qa.append((tok.encode(NIAH_QUESTION.format(key=keys[i])), False))
            qa.append((self.answer_tokens("is", f" {values[i]}."), True))
        used = 1 + sum(len(n) for n in needles) + sum(len(t) for t, _ in qa)
        n_hay = max(8, length - used)
        if self.rng.random() < 0.55:
            hay = list(self.noise_unit)
            while len(hay) < n_hay:
                hay += self.newline + self.noise_unit
        else:
            hay = tok.encode(" ".join(self.story_text(n_hay + 50)))
            while len(hay) < n_hay:
                hay += tok.encode(" ".join(self.story_text(n_hay)))
        hay = hay[:n_hay]
        # Needle positions: just after a token holding '.', as niah.cpp moves them.
        cuts = sorted(self.rng.randint(0, n_hay) for _ in range(k))
        snapped = []
        for c in cuts:
            while 0 < c < n_hay and hay[c - 1] not in self.dot_ids:
                c -= 1
            snapped.append(c)
        spans = [([tok.bos_id], False)]
        prev = 0
        for c, needle in zip(snapped, needles):
            spans.append((hay[prev:c], False))
            spans.append((needle, False))
            prev = c
        spans.append((hay[prev:], False))
        return spans + qa

    def ruler_niah_doc(self, length):
        """`eval ruler` niah_* layout (niah_generate): template, context with RULER needles in an
        essay (stories or noise words), repeated noise lines or distractor needles; then the
        question with its answer prefix and the answers; extra questions for density."""
        tok, rng = self.tok, self.rng
        haystack = rng.choice(["essay", "essay", "repeat", "needle"])
        type_v = rng.choice(["numbers", "numbers", "numbers", "uuids"])
        type_k = "uuids" if (haystack == "needle" and rng.random() < 0.5) else "words"
        draw_v = self.number if type_v == "numbers" else self.uuid
        draw_k = self.key if type_k == "words" else self.uuid
        shape = rng.choice(["single", "single", "multikey", "multivalue", "multiquery"])
        if length < 450 and shape in ("multivalue", "multiquery"):
            shape = "multikey"
        num_k = {"single": 1, "multikey": rng.randint(2, 6), "multivalue": 1, "multiquery": 4}[shape]
        if shape == "multikey":
            num_k = min(num_k, max(2, (length - 120) // 110))
        num_v = 4 if shape == "multivalue" else 1
        num_q = 4 if shape == "multiquery" else 1
        keys = self.distinct(draw_k, num_k)
        values = [[draw_v() for _ in range(num_v)] for _ in keys]
        needles = [
            RULER_NEEDLE.format(type_needle_v=type_v, key=k, value=v)
            for k, vs in zip(keys, values)
            for v in vs
        ]
        rng.shuffle(needles)
        budget = length - 80 - 45 * len(needles) - 60 * num_q
        if haystack == "essay":
            if rng.random() < 0.6:
                sents = self.story_text(max(budget, 20))
            else:
                reps = max(1, budget // 50)
                sents = (" ".join([RULER_NOISE] * reps)).replace(". ", ".\x00").split("\x00")
            cut = sorted(rng.randint(0, len(sents)) for _ in needles)
            parts, prev = [], 0
            for c, nd in zip(cut, needles):
                parts.append(" ".join(sents[prev:c]))
                parts.append(nd)
                prev = c
            parts.append(" ".join(sents[prev:]))
            context = " ".join(p for p in parts if p)
        else:
            if haystack == "repeat":
                n = max(1, budget // 51)
                lines = [RULER_NOISE] * n
            else:
                n = max(1, budget // 45)
                lines = [
                    RULER_NEEDLE.format(type_needle_v=type_v, key=draw_k(), value=draw_v())
                    for _ in range(n)
                ]
            for nd in needles:
                lines.insert(rng.randint(0, len(lines)), nd)
            context = "\n".join(lines)
        qi = rng.sample(range(num_k), num_q)
        queries = [keys[i] for i in qi]
        answers = [v for i in qi for v in values[i]]
        before, after, word = ruler_question(type_v, queries, num_v)
        spans = [([tok.bos_id], False), (tok.encode(before + context), False)]
        spans.append((tok.encode(after), False))
        spans.append((self.answer_tokens(word, " " + ", ".join(answers) + "."), True))
        # Extra single questions on the same context (dense supervision).
        if shape in ("multikey", "multiquery") or rng.random() < 0.5:
            single = (RULER_TEMPLATE + RULER_ANSWER_PREFIX).replace("are all", "is")
            single = single.replace("are", "is")
            q_at = single.find("{context}")
            for i in rng.sample(range(num_k), min(num_k, 3)):
                if num_v != 1:
                    break
                q = single[q_at + 9 :].format(type_needle_v=type_v[:-1], query=keys[i])
                spans.append((tok.encode(q), False))
                spans.append((self.answer_tokens("is", " " + values[i][0] + "."), True))
        return spans

    def vt_chain(self, hops, n_noise):
        """RULER variable tracking's context: a chain VAR X0 = value, VAR X1 = VAR X0, ... of
        `hops` assignments placed at random among max(n_noise, chain) noise sentences; returns
        (context, value, names)."""
        rng = self.rng
        names = self.distinct(lambda: "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)), hops + 1)
        value = str(rng.randint(10000, 99998))
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
        n = max(n_noise, len(chain))
        sents = [VT_NOISE] * n
        pos = sorted(rng.sample(range(n), len(chain)))
        for j, p in enumerate(pos):
            sents.insert(p + j, chain[j])
        return " ".join(sents).replace(". \n", ".\n"), value, names

    def vt_doc(self, length):
        """`eval ruler` vt layout (vt_generate): one chain of 4 hops in noise lines; answers."""
        tok = self.tok
        hops = 4
        context, value, names = self.vt_chain(hops, (length - 150) // 52)
        templ = VT_TEMPLATE + VT_ANSWER_PREFIX
        at = templ.find("{context}")
        before = templ[:at]
        after = templ[at + 9 :].format(query=value, num_v=hops + 1)
        spans = [([tok.bos_id], False), (tok.encode(before + context), False)]
        spans.append((tok.encode(after), False))
        ans = tok.encode("x " + " ".join(names))[len(tok.encode("x")) :]
        spans.append((ans, True))
        return spans

    # -- eval-exact RULER layouts (stage 3) --
    def _draw_of(self, kind):
        return {"numbers": self.number, "uuids": self.uuid, "words": self.key}[kind]

    def _fit(self, build, budget, n_guess):
        """The largest haystack size n (about) whose build(n) tokens fit budget: the eval fits
        n to the length the same way (fit_size), so training sees the eval's needle density."""
        n = max(1, n_guess)
        for _ in range(8):
            toks = build(n)
            if len(toks[0]) <= budget:
                if len(toks[0]) > 0.93 * budget:
                    return toks
                n2 = max(n + 1, int(n * budget / max(1, len(toks[0])) * 0.98))
                toks2 = build(n2)
                return toks2 if len(toks2[0]) <= budget else toks
            n = max(1, int(n * budget / len(toks[0]) * 0.97))
            if n == 1:
                return build(1)
        return build(max(1, n // 2))

    def ruler_task_doc(self, length, task=None):
        """One `eval ruler` niah task sample exactly as ruler.cpp's niah_generate builds it
        (haystack, needle wording, depths, singular/plural template, answer prefix), sized to
        the document length; the answer lists multi-value values in the order they appear in
        the context (string_match_all ignores order, and an order the context fixes is
        learnable where niah.py's draw order is not). Then extra single questions in the same
        wording on other needles of the context (distractor needles are needles too), for dense
        supervision."""
        tok, rng = self.tok, self.rng
        if task is None:
            r, acc = rng.random(), 0.0
            for task, share in self.rtask_mix.items():
                acc += share
                if r < acc:
                    break
        haystack, type_k, type_v, nk, nv, nq = RULER_TASKS[task]
        num_k = max(nk, nq)
        draw_k, draw_v = self._draw_of(type_k), self._draw_of(type_v)
        keys = self.distinct(draw_k, num_k)
        values = [[draw_v() for _ in range(nv)] for _ in keys]
        needle_of = lambda k, v: RULER_NEEDLE.format(type_needle_v=type_v, key=k, value=v)  # noqa: E731
        needles = [(k, v) for k, vs in zip(keys, values) for v in vs]
        rng.shuffle(needles)
        qi = rng.sample(range(num_k), nq)
        queries = [keys[i] for i in qi]
        before, after, word = ruler_question(type_v, queries, nv)
        single = (RULER_TEMPLATE + RULER_ANSWER_PREFIX).replace("Some", "A").replace("are all", "is")
        single = single.replace("are", "is")
        single_q = single[single.find("{context}") + 9 :]
        essay_words = (RULER_NOISE if rng.random() < 0.6 else " ".join(self.story_text(length))).split()
        extra_budget = rng.choice([0, 1, 2, 3]) * (110 if "uuids" in (type_k, type_v) else 45)
        fixed = len(tok.encode(after)) + 4 + 14 * nv * nq * (3 if type_v == "uuids" else 1) + extra_budget
        budget = max(64, length - 1 - fixed)
        state = {}

        def build(n):
            local = random.Random(self.rng.random())
            lines = []  # (text, key, value) of every needle in the context, in order
            if haystack == "essay":
                words = [essay_words[i % len(essay_words)] for i in range(n)]
                text = " ".join(words)
                sents = re.split(r"(?<=\.) ", text)
                depths = sorted(local.sample(range(40), len(needles)))
                pos = [0] + [len(sents) * round(100 * d / 39) // 100 for d in depths] + [len(sents)]
                parts = []
                for i in range(1, len(pos)):
                    parts.append(" ".join(sents[pos[i - 1] : pos[i]]))
                    if i - 1 < len(needles):
                        k, v = needles[i - 1]
                        parts.append(needle_of(k, v))
                        lines.append((k, v))
                context = " ".join(parts)
            else:
                sents = []
                for _ in range(n):
                    if haystack == "repeat":
                        sents.append((RULER_NOISE, None, None))
                    else:
                        k, v = draw_k(), draw_v()
                        sents.append((needle_of(k, v), k, v))
                for k, v in needles:
                    sents.insert(local.randint(0, len(sents)), (needle_of(k, v), k, v))
                lines = [(k, v) for _, k, v in sents if k is not None]
                context = "\n".join(x for x, _, _ in sents)
            toks = tok.encode(before + context)
            state["lines"] = lines
            return (toks,)

        ctx_toks = self._fit(build, budget, 10 if haystack != "essay" else budget // 2)[0]
        lines = state["lines"]
        order = {}
        for i, (k, v) in enumerate(lines):
            order.setdefault((k, v), i)
        answers = []
        for i in qi:
            answers += sorted(values[i], key=lambda v: order.get((keys[i], v), 0))
        spans = [([tok.bos_id], False), (ctx_toks, False), (tok.encode(after), False)]
        spans.append((self.answer_tokens(word, " " + ", ".join(answers) + "."), True))
        # Extra questions: keys that occur once in the context.
        count = {}
        for k, _ in lines:
            count[k] = count.get(k, 0) + 1
        once = [(k, v) for k, v in lines if count[k] == 1]
        used = sum(len(t) for t, _ in spans)
        for k, v in rng.sample(once, min(len(once), 4)):
            q = tok.encode(single_q.format(type_needle_v=type_v[:-1], query=k))
            a = self.answer_tokens("is", " " + v + ".")
            if used + len(q) + len(a) > length:
                break
            spans += [(q, False), (a, True)]
            used += len(q) + len(a)
        return spans

    def vt_icl_doc(self, length):
        """`eval ruler` vt exactly: a one-shot example (at most length / 5 tokens, its answer
        after "they are: " + " ", as ruler.cpp writes it) and then the task, the noise sized to
        the length. Both answers are supervised."""
        tok, rng = self.tok, self.rng
        hops = 4

        def chain_text(n_noise):
            context, value, names = self.vt_chain(hops, n_noise)
            templ = VT_TEMPLATE + VT_ANSWER_PREFIX
            at = templ.find("{context}")
            return templ[:at] + context, templ[at + 9 :].format(query=value, num_v=hops + 1), names

        spans = [([tok.bos_id], False)]
        used = 1
        if length >= 1400 and rng.random() < 0.85:  # the example alone is ~400 tokens
            ex_ctx, ex_q, ex_names = chain_text(max(1, (length // 5 - 300) // 51))
            spans += [(tok.encode(ex_ctx), False), (tok.encode(ex_q), False)]
            ans = tok.encode("x " + " ".join(ex_names))[len(tok.encode("x")) :]
            spans += [(ans, True), (tok.encode("\n\n"), False)]
            used = sum(len(t) for t, _ in spans)
        n_noise = max(1, (length - used - 300) // 51)
        for _ in range(4):  # fit the noise to the length, as the eval's fit_size does
            ctx, q, names = chain_text(n_noise)
            main = [(tok.encode(ctx), False), (tok.encode(q), False)]
            main.append((tok.encode("x " + " ".join(names))[len(tok.encode("x")) :], True))
            over = used + sum(len(t) for t, _ in main) - length
            if over <= 0 or n_noise == 1:
                break
            n_noise = max(1, n_noise - over // 51 - 1)
        return spans + main

    def lm_doc(self, length):
        return [([self.tok.bos_id], False), (self.tok.encode(" ".join(self.story_text(length))), False)]

    def copy_doc(self, length):
        """Induction drill: a random span (tokens, digits or keys) and its repeats; the repeats
        are supervised. Dense copying signal, so that copy heads form early."""
        tok, rng = self.tok, self.rng
        n = rng.randint(8, max(9, min(80, length // 3)))
        kind = rng.random()
        if kind < 0.4:
            span = [rng.randrange(3, len(tok.pieces)) for _ in range(n)]
        elif kind < 0.7:
            span = tok.encode(" ".join(self.number() for _ in range(max(1, n // 8))))
        else:
            span = tok.encode(" ".join(self.key() for _ in range(max(1, n // 8))))
        spans = [([tok.bos_id], False), (span, False)]
        while sum(len(t) for t, _ in spans) + len(span) <= length:
            spans.append((span, True))
        return spans

    def mqar_doc(self, length):
        """Multi-query associative recall (Zoology's MQAR) with single-token keys and values:
        BOS, k1 v1 k2 v2 ... kN vN, then the keys again in random order, each followed by its
        value (supervised). The one-hop version of the needle question: a previous-token head
        plus a matching head answer it, the circuit the needle questions need."""
        rng = self.rng
        n = max(2, min(64, (length - 1) // 4))
        n = rng.randint(max(2, n // 2), n)
        keys = rng.sample(self.word_ids, n)
        values = [rng.choice(self.digit_ids) if rng.random() < 0.5 else rng.choice(self.word_ids) for _ in keys]
        spans = [([self.tok.bos_id], False)]
        for k, v in zip(keys, values):
            spans.append(([k, v], False))
        for i in rng.sample(range(n), n):
            spans.append(([keys[i]], False))
            spans.append(([values[i]], True))
        return spans

    def dense_doc(self, length):
        """The `eval niah` needle and question wording with little haystack: many needles, one
        noise or story sentence between them, and a question for every needle. The bridge from
        MQAR (one-token keys, no filler) to needles in long filler."""
        tok, rng = self.tok, self.rng
        k = max(1, min(12, (length - 8) // 42))
        k = rng.randint(max(1, k // 2), k)
        keys = self.distinct(self.key, k)
        values = [self.number() for _ in keys]
        spans = [([tok.bos_id], False)]
        for a, v in zip(keys, values):
            if rng.random() < 0.5:
                spans.append((tok.encode(rng.choice(self.story_sents)[:120]), False))
            spans.append((tok.encode(NIAH_NEEDLE.format(key=a, value=v)), False))
        for i in rng.sample(range(k), k):
            spans.append((tok.encode(NIAH_QUESTION.format(key=keys[i])), False))
            spans.append((self.answer_tokens("is", f" {values[i]}."), True))
        return spans

    def kind_doc(self, kind, length):
        return {
            "copy": self.copy_doc,
            "mqar": self.mqar_doc,
            "dense": self.dense_doc,
            "niah": self.niah_doc,
            "ruler": self.ruler_niah_doc,
            "rtask": self.ruler_task_doc,
            "vt": self.vt_doc,
            "vtx": self.vt_icl_doc,
            "lm": self.lm_doc,
        }[kind](length)

    def document(self, length):
        if self.mix is not None:
            r, acc = self.rng.random(), 0.0
            for kind, share in self.mix.items():
                acc += share
                if r < acc:
                    return self.kind_doc(kind, length)
            return self.kind_doc(kind, length)
        # (No draw when the share is 0, so default runs see the same stream as before the drill.)
        if self.copy_share > 0 and self.rng.random() < self.copy_share:
            return self.copy_doc(length)
        r = self.rng.random()
        if r < 0.38:
            return self.niah_doc(length)
        if r < 0.80:
            return self.ruler_niah_doc(length)
        if r < 0.90:
            return self.vt_doc(length)
        return self.lm_doc(length)

    def row(self, T):
        """T + 1 tokens and T + 1 answer flags: documents of varied length packed together."""
        toks, flags = [], []
        while len(toks) < T + 1:
            room = T + 1 - len(toks)
            if room < 96:
                length = room
                spans = self.lm_doc(room)
            else:
                length = self.rng.randint(max(64, room // 3), room)
                spans = self.document(length)
            doc_t, doc_f = [], []
            for t, a in spans:
                doc_t += t
                doc_f += [a] * len(t)
            if len(doc_t) > room:
                if any(doc_f) and self.rng.random() < 0.9 and room >= 96:
                    continue  # too long: draw another rather than lose the questions
                doc_t, doc_f = doc_t[:room], doc_f[:room]
            toks += doc_t
            flags += doc_f
        return toks[: T + 1], flags[: T + 1]
