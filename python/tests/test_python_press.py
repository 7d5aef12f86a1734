# SPDX-License-Identifier: Apache-2.0
"""Presses written in Python run inside the engine, with its allocator and selector."""

import numpy as np
import pytest

import protokv

from test_model import PROMPT


class PySnapKV(protokv.ScorerPress):
    """SnapKV's score (SnapKV Eq. 4, as `protokv help-presses` documents the built-in one):
    the last `window` queries' causal softmax attention summed over the window, max-pooled per
    query head (kernel 7, stride 1, -inf padding), averaged over each KV head's group."""

    window = 8
    pool = 7

    def score(self, keys, values, window_queries, positions):
        n_kv, n, d = keys.shape
        n_heads, w, _ = window_queries.shape
        group = n_heads // n_kv
        prefix = n - w
        out = np.zeros((n_kv, prefix), dtype=np.float32)
        causal = np.arange(n)[None, :] <= (n - w + np.arange(w))[:, None]
        for h in range(n_heads):
            logits = (window_queries[h] @ keys[h // group].T) / np.float32(np.sqrt(d))
            logits = np.where(causal, logits, -np.inf).astype(np.float32)
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            summed = probs.sum(axis=0)[:prefix]
            padded = np.concatenate([np.full(self.pool // 2, -np.inf, np.float32), summed,
                                     np.full(self.pool // 2, -np.inf, np.float32)])
            pooled = np.lib.stride_tricks.sliding_window_view(padded, self.pool).max(axis=1)
            out[h // group] += pooled / group
        return out


class KNorm(protokv.ScorerPress):
    """Keeps the keys of smallest L2 norm (kvpress's KnormPress: score = -||k||)."""

    def score(self, keys, values, window_queries, positions):
        return -np.linalg.norm(keys, axis=-1)


def test_a_python_snapkv_keeps_exactly_the_builtin_entries(recall):
    for text in (PROMPT, PROMPT[::-1], "The vault number is 9314. " * 6 + "Which number?"):
        ids = recall.tokenize(text, special=True)
        for budget in (12, 20):
            ours, builtin = recall.session(press=PySnapKV(), budget=budget), \
                recall.session(press="snapkv", budget=budget)
            la, lb = ours.prefill(ids), builtin.prefill(ids)
            np.testing.assert_array_equal(la, lb)
            for layer in range(recall.n_layers):
                for a, b in zip(ours.kv(layer), builtin.kv(layer)):
                    np.testing.assert_array_equal(a["positions"], b["positions"])
                    np.testing.assert_array_equal(a["keys"], b["keys"])
            assert ours.kv_bytes() == builtin.kv_bytes()


def test_knorm_keeps_the_smallest_norm_keys_and_generates(recall):
    ids = recall.tokenize(PROMPT, special=True)
    full, knorm = recall.session(), recall.session(press=KNorm(), budget=10)
    full.prefill(ids)
    knorm.prefill(ids)
    for layer in range(recall.n_layers):
        for f, k in zip(full.kv(layer), knorm.kv(layer)):
            norms = np.linalg.norm(f["keys"], axis=-1)
            expected = np.sort(np.argsort(norms, kind="stable")[:10]).astype(np.int32)
            np.testing.assert_array_equal(k["positions"], expected)
    out = recall(PROMPT, max_tokens=6, temperature=0, press=KNorm(), budget=10)
    assert out["kv_compression"]["press"] == "KNorm"
    assert out["usage"]["completion_tokens"] >= 1


def test_python_presses_compose_with_allocators(recall):
    ids = recall.tokenize(PROMPT, special=True)
    s = recall.session(press=KNorm(alloc="adakv", floor=0.5), budget=10)
    s.prefill(ids)
    sizes = [len(h["positions"]) for layer in range(recall.n_layers) for h in s.kv(layer)]
    assert sum(sizes) == 10 * len(sizes)  # adakv moves budget between heads, same total
    with pytest.raises(protokv.Error):
        KNorm(alloc="nope")
    with pytest.raises(protokv.Error):
        KNorm(alloc="adakv", bogus=1)


def test_a_failing_or_wrong_score_raises_and_leaves_the_session_usable(recall):
    class Broken(protokv.ScorerPress):
        def score(self, keys, values, window_queries, positions):
            raise RuntimeError("boom")

    class WrongShape(protokv.ScorerPress):
        def score(self, keys, values, window_queries, positions):
            return np.zeros(3)

    ids = recall.tokenize(PROMPT, special=True)
    s = recall.session(press=Broken(), budget=8)
    with pytest.raises(RuntimeError, match="boom"):
        s.prefill(ids)
    with pytest.raises(ValueError, match="n_kv_heads"):
        recall.session(press=WrongShape(), budget=8).prefill(ids)
    with pytest.raises(NotImplementedError):
        recall.session(press=protokv.ScorerPress(), budget=8).prefill(ids)
    # The engine is fine afterwards.
    full = recall.session()
    assert full.prefill(ids).shape == (recall.n_vocab,)
