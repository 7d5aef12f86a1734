# SPDX-License-Identifier: Apache-2.0
"""protokv from Python: the package must agree with the CLI and the C++ library."""

import json
import pathlib
import subprocess
import threading
import time

import numpy as np
import pytest

import protokv

PROMPT = (
    "The archive of the northern station lists every delivery. The code for the blue door is "
    "4821. Crates arrive on Mondays and leave on Fridays; the ledger is kept by the clerk. "
    "What is the code for the blue door?"
)


def cli_generate(cli, model_path, prompt, n, press=None, budget=None):
    cmd = [cli, "generate", "-m", model_path, "-p", prompt, "-n", str(n), "--temp", "0",
           "--json", "-t", "2"]
    if press:
        cmd += ["--press", press, "--budget", str(budget)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("press,budget", [(None, None), ("snapkv", 12), ("protokv", 12),
                                          ("streaming_llm", 12), ("h2o", 16)])
def test_greedy_tokens_equal_the_cli(recall, recall_path, protokv_cli, press, budget):
    ref = cli_generate(protokv_cli, recall_path, PROMPT, 12, press, budget)
    out = recall.create_completion(PROMPT, max_tokens=12, temperature=0, press=press,
                                   budget=budget, ignore_eos=False)
    assert out["usage"]["prompt_tokens"] == ref["prompt_tokens"]
    assert out["choices"][0]["text"] == ref["text"]
    assert recall.tokenize(out["choices"][0]["text"], add_bos=False) or not ref["text"]
    assert out["kv_compression"]["kv_bytes_after_prefill"] == ref["kv_bytes_after_prefill"]


def test_session_logits_follow_the_greedy_path(recall, recall_path, protokv_cli):
    """Prefill then decode by hand, argmax each step: the CLI's greedy tokens."""
    ref = cli_generate(protokv_cli, recall_path, PROMPT, 8, "snapkv", 12)
    s = recall.session(press="snapkv", budget=12)
    ids = recall.tokenize(PROMPT, add_bos=True, special=True)
    logits = s.prefill(ids)
    assert logits.dtype == np.float32 and logits.shape == (recall.n_vocab,)
    assert not logits.flags.writeable
    tokens = []
    for _ in range(8):
        t = int(np.argmax(logits))
        tokens.append(t)
        logits = s.decode(t)
    assert tokens == ref["generated_tokens"]
    assert s.n_past == len(ids) + 8


@pytest.mark.parametrize("press,budget", [(None, None), ("snapkv", 12), ("pod", 24)])
def test_logits_equal_the_cli_sessions_bit_for_bit(recall, recall_path, protokv_cli, tmp_path,
                                                   press, budget):
    dump = tmp_path / "logits.npy"
    cmd = [protokv_cli, "generate", "-m", recall_path, "-p", PROMPT, "-n", "6", "--temp", "0",
           "--json", "-t", "2", "--ignore-eos", "--logits-out", str(dump)]
    if press:
        cmd += ["--press", press, "--budget", str(budget)]
    ref = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                    check=True).stdout)
    expected = np.load(dump)
    assert expected.shape == (6, recall.n_vocab) and expected.dtype == np.float32
    s = recall.session(press=press, budget=budget)
    rows = [s.prefill(recall.tokenize(PROMPT, special=True)).copy()]
    for t in ref["generated_tokens"][:-1]:
        rows.append(s.decode(t).copy())
    np.testing.assert_array_equal(np.stack(rows), expected)


def test_logits_view_is_the_engines_buffer_and_equals_a_fresh_session(recall):
    ids = recall.tokenize(PROMPT, special=True)
    a, b = recall.session(), recall.session()
    la = a.prefill(ids).copy()
    view = a.logits()
    np.testing.assert_array_equal(b.prefill(ids), la)  # bit for bit, same engine path
    a.decode(5)
    assert not np.array_equal(view, la)  # the view follows the buffer
    np.testing.assert_array_equal(view, a.logits())


def test_kv_after_compression(recall):
    ids = recall.tokenize(PROMPT, special=True)
    n = len(ids)
    full, snap = recall.session(), recall.session(press="snapkv", budget=12)
    full.prefill(ids)
    snap.prefill(ids)
    assert snap.kv_bytes() < full.kv_bytes()
    total = 0
    for layer in range(recall.n_layers):
        heads = snap.kv(layer)
        assert len(heads) == recall.n_kv_heads
        for h in heads:
            assert h["keys"].shape == (12, recall.head_dim)
            assert h["values"].shape == (12, recall.head_dim)
            pos = h["positions"]
            assert pos.dtype == np.int32 and len(set(pos.tolist())) == 12
            assert pos.min() >= 0 and pos.max() < n
            # SnapKV keeps its observation window (the last 8 prompt tokens).
            assert set(range(n - 8, n)) <= set(pos.tolist())
            total += h["keys"].nbytes + h["values"].nbytes
        full_heads = full.kv(layer)
        for h, f in zip(heads, full_heads):
            np.testing.assert_array_equal(f["positions"], np.arange(n, dtype=np.int32))
            # Kept entries are the full cache's rows at those positions.
            np.testing.assert_array_equal(h["keys"], f["keys"][h["positions"]])
            np.testing.assert_array_equal(h["values"], f["values"][h["positions"]])
    assert total == snap.kv_bytes()


@pytest.mark.parametrize("cache_type, key_tolerance", [("f16", 2e-3), ("bf16", 2e-2),
                                                      ("q8_0", 5e-2), ("q4_0", 0.5)])
def test_cache_types_store_smaller_rows_read_back_as_floats(recall, cache_type, key_tolerance):
    ids = recall.tokenize(PROMPT, special=True)
    full = recall.session()
    full.prefill(ids)
    s = recall.session(press="snapkv", budget=12, cache_type_k=cache_type,
                       cache_type_v=cache_type)
    assert np.isfinite(s.prefill(ids)).all()
    # 12 entries per head in the type's rows (head width 32: one block of a quantised type).
    row_bytes = {"f16": 64, "bf16": 64, "q8_0": 34, "q4_0": 18}[cache_type]
    assert s.kv_bytes() == recall.n_layers * recall.n_kv_heads * 12 * 2 * row_bytes
    for layer in range(recall.n_layers):
        for h, f in zip(s.kv(layer), full.kv(layer)):
            assert h["keys"].dtype == np.float32
            # The stored rows stand for the full cache's rows at the kept positions.
            np.testing.assert_allclose(h["keys"], f["keys"][h["positions"]],
                                       atol=key_tolerance * np.abs(f["keys"]).max())
    with pytest.raises(protokv.Error, match="unknown KV cache type 'q5_K'"):
        recall.session(cache_type_k="q5_K")


@pytest.mark.parametrize("press", protokv.list_presses())
def test_every_press_runs_and_shows_its_cache(recall, press):
    ids = recall.tokenize(PROMPT * 4, special=True)  # chelsea needs room for 16 sinks + 64 recent
    n = len(ids)
    s = recall.session(press=press, ratio=0.5)
    logits = s.prefill(ids)
    assert np.isfinite(logits).all()
    for layer in range(recall.n_layers):
        for h in s.kv(layer):
            m = len(h["positions"])
            assert 1 <= m <= n
            assert h["keys"].shape == h["values"].shape == (m, recall.head_dim)
            assert np.isfinite(h["keys"]).all() and np.isfinite(h["values"]).all()
            assert h["positions"].min() >= 0 and h["positions"].max() < n
    s.decode(int(np.argmax(logits)))
    assert s.n_past == n + 1


def test_streaming_equals_the_whole_completion(recall):
    kw = dict(max_tokens=10, temperature=0, press="snapkv", budget=12)
    whole = recall(PROMPT, **kw)
    chunks = list(recall(PROMPT, stream=True, **kw))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stop_strings_cut_the_text(recall):
    whole = recall(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)["choices"][0]["text"]
    assert len(whole) > 4
    stop = whole[2:4]
    out = recall(PROMPT, max_tokens=12, temperature=0, stop=[stop], ignore_eos=True)
    assert out["choices"][0]["text"] == whole[: whole.find(stop)]
    assert out["choices"][0]["finish_reason"] == "stop"


def test_sampling_is_seeded(recall):
    a = recall(PROMPT, max_tokens=10, temperature=1.0, seed=7)["choices"][0]["text"]
    b = recall(PROMPT, max_tokens=10, temperature=1.0, seed=7)["choices"][0]["text"]
    assert a == b


def test_n_ctx_bounds_the_reply(recall_path):
    small = protokv.Model(recall_path, n_threads=1, n_ctx=64)
    ids = small.tokenize(PROMPT, special=True)[:40]
    out = small(ids, max_tokens=1000, temperature=0, ignore_eos=True)
    assert out["usage"]["total_tokens"] <= 64 + 1
    assert out["choices"][0]["finish_reason"] == "length"
    with pytest.raises(protokv.Error, match="n_ctx"):
        small.session().prefill(list(range(3, 70)))


def test_tokenize_roundtrip(recall):
    ids = recall.tokenize("hello world", add_bos=True)
    assert ids[0] == recall.token_bos()
    assert recall.detokenize(ids) == b"hello world"
    assert recall.tokenize(b"hello world") == ids


def test_every_press_is_constructible_with_its_defaults():
    names = protokv.list_presses()
    assert {"full", "snapkv", "protokv", "h2o", "pod"} <= set(names)
    classes = {n: c for n, c in vars(protokv.presses).items()
               if isinstance(c, type) and issubclass(c, protokv.Press) and c is not protokv.Press}
    assert sorted(c.name for c in classes.values()) == sorted(names)
    for cls in classes.values():
        press = cls()
        assert press.spec == cls.name
        assert isinstance(press.config(), dict)
    snap = protokv.presses.SnapKV(window=4, pool=3)
    assert snap.spec == "snapkv:window=4,pool=3"
    assert protokv.presses.SnapKV().config() != snap.config()


def test_press_classes_carry_the_engine_option_schema():
    rows = protokv.presses.press_options("snapkv")
    assert [r["key"] for r in rows] == ["window", "pool", "pool_type", "gqa", "gqa_order"]
    assert rows[0]["default"] == "8" and rows[0]["values"] == "1..4096"
    assert rows[0]["reference"] == "SnapKV Eq. 4"
    assert protokv.presses.SnapKV.OPTIONS == tuple(r["key"] for r in rows)
    assert "``pool`` = 7" in protokv.presses.SnapKV.__doc__
    # protokv's own default differs where the paper says so (Eq. 18: unpooled scores).
    pool = [r for r in protokv.presses.press_options("protokv") if r["key"] == "pool"]
    assert pool[0]["default"] == "1"
    assert protokv.presses.ProtoKV().config()["pool"] == 1
    # pyramidkv's options include its allocator's.
    assert "beta" in protokv.presses.PyramidKV.OPTIONS
    assert protokv.presses.Full.OPTIONS == ()
    with pytest.raises(protokv.Error, match="unknown press"):
        protokv.presses.press_options("nope")


def test_press_objects_generate_like_spec_strings(recall):
    kw = dict(max_tokens=8, temperature=0, budget=12)
    a = recall(PROMPT, press=protokv.presses.SnapKV(window=4), **kw)
    b = recall(PROMPT, press="snapkv:window=4", **kw)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["kv_compression"]["press"] == "snapkv:window=4"


def test_chat_completion(recall_path):
    # The recall model's file has no chat template: name one.
    recall = protokv.Model(recall_path, n_threads=2, chat_format="chatml")
    assert recall.chat_format == "chatml"
    out = recall.create_chat_completion(
        [{"role": "user", "content": "What is the code?"}], max_tokens=6, temperature=0)
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"]["role"] == "assistant"
    chunks = list(recall.create_chat_completion(
        [{"role": "user", "content": "What is the code?"}], max_tokens=6, temperature=0,
        stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == out["choices"][0]["message"]["content"]


def test_bad_inputs_raise(recall, recall_path, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(protokv.Error):
        protokv.Model(str(bad))
    with pytest.raises(ValueError):  # protokv.Error is a ValueError
        protokv.Model(str(tmp_path / "missing.gguf"))
    with pytest.raises(protokv.Error, match="nope"):
        recall.session(press="nope", budget=4)
    with pytest.raises(protokv.Error, match="budget"):
        recall.session(press="snapkv")
    with pytest.raises(protokv.Error, match="unknown option|wndow"):
        protokv.presses.SnapKV(wndow=3)
    with pytest.raises(protokv.Error, match="outside the vocabulary"):
        recall.session().prefill([0, 1, 100000])
    with pytest.raises(protokv.Error, match="no chat template"):
        recall.create_chat_completion([{"role": "user", "content": "hi"}])
    with pytest.raises(protokv.Error, match="chat"):
        protokv.Model(recall_path, chat_format="nope")
    with pytest.raises(protokv.Error):
        recall.session().prefill([])
    with pytest.raises(protokv.Error, match="out of range"):
        recall.detokenize([-1])
    with pytest.raises(protokv.Error, match="n_ctx"):
        protokv.Model(recall_path, n_ctx=10**9)
    with pytest.raises(protokv.Error, match="layer"):
        recall.session().kv(99)
    with pytest.raises(protokv.Error, match="top-p"):
        recall(PROMPT, max_tokens=2, top_p=0.0)
    with pytest.raises(protokv.Error, match="temperature"):
        recall(PROMPT, max_tokens=2, temperature=-1)
    with pytest.raises(protokv.Error, match="budget or ratio"):
        recall.session(press="snapkv", budget=12, ratio=0.5)
    with pytest.raises(protokv.Error, match="ratio"):
        recall.session(press="snapkv", ratio=1.5)


def test_the_gil_is_released_while_the_engine_runs(recall):
    """A Python thread keeps running while another one prefills."""
    ids = recall.tokenize(PROMPT * 12, special=True)[:1500]
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    s = recall.session()
    t = threading.Thread(target=ticker)
    t.start()
    start = time.perf_counter()
    for _ in range(3):
        s.prefill(ids)
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    during = [x for x in ticks if start <= x <= start + elapsed]
    # With the GIL held, the ticker would not run at all during the prefills.
    assert len(during) >= 5, (len(during), elapsed)


def test_eval_fidelity_returns_the_clis_report(recall, recall_path, protokv_cli, tmp_path):
    text = PROMPT * 30
    path = tmp_path / "text.txt"
    path.write_text(text)
    cli = subprocess.run(
        [protokv_cli, "eval", "fidelity", "-m", recall_path, "-f", str(path), "--press",
         "snapkv,h2o", "--budget", "16,24", "--samples", "2", "--prompt-len", "64",
         "--continuation", "8", "--json", "-t", "2", "--quiet"],
        capture_output=True, text=True, timeout=300, check=True)
    ref = json.loads(cli.stdout)
    out = protokv.eval.fidelity(recall, text, ["snapkv", protokv.presses.H2O()], [16, 24],
                                samples=2, prompt_len=64, continuation=8)
    assert set(out) == set(ref)
    assert len(out["results"]) == len(ref["results"]) == 4
    timing = ("_ms", "ms_per_token")
    for a, b in zip(out["results"], ref["results"]):
        assert set(a) == set(b)
        for key in a:
            if not any(t in key for t in timing):
                assert a[key] == b[key], key
    for key in ("presses", "budgets", "prompt_len", "continuation", "samples", "sample_origins"):
        assert out["config"][key] == ref["config"][key], key
    # out= writes the CLI's folder; resume=True reads its finished samples back.
    kept = protokv.eval.fidelity(recall, text, ["snapkv", protokv.presses.H2O()], [16, 24],
                                 samples=2, prompt_len=64, continuation=8, out=tmp_path / "fid")
    folder = tmp_path / "fid" / f"fidelity_{pathlib.Path(recall_path).stem}_p64_c8_s2"
    assert json.loads((folder / "results.json").read_text())["results"] == kept["results"]
    assert len((folder / "samples.jsonl").read_text().splitlines()) == 3  # header + 2 samples
    resumed = protokv.eval.fidelity(recall, text, ["snapkv", protokv.presses.H2O()], [16, 24],
                                    samples=2, prompt_len=64, continuation=8,
                                    out=tmp_path / "fid", resume=True)
    assert resumed["results"] == kept["results"]  # timings included: read back, not re-run
    with pytest.raises(protokv.Error, match="needs out="):
        protokv.eval.fidelity(recall, text, ["snapkv"], [16], samples=1, resume=True)
    with pytest.raises(protokv.Error, match="samples"):
        protokv.eval.fidelity(recall, text, ["snapkv"], [16], samples=0)
    with pytest.raises(protokv.Error, match="nope"):
        protokv.eval.fidelity(recall, text, ["nope"], [16], samples=1, prompt_len=32)


def test_eval_fidelity_at_equal_memory(recall):
    # kv_memory_shares: per sample and press the budget that stores the share; snapkv evicts to
    # floor(0.25 * 64) = 16 entries, so its row is the budget-16 row's numbers.
    text = PROMPT * 30
    out = protokv.eval.fidelity(recall, text, ["snapkv", "pod:delta=0"], [16],
                                kv_memory_shares=[0.25, 0.9], samples=2, prompt_len=64,
                                continuation=4)
    rows = {(r["press"], r.get("memory_share")): r for r in out["results"]}
    assert len(rows) == 6
    snap_budget, snap_share = rows[("snapkv", None)], rows[("snapkv", 0.25)]
    assert snap_share["budget"] is None and snap_share["solved_budget"] == 16
    assert snap_share["per_sample"] == snap_budget["per_sample"]
    assert snap_share["stored_share"] == pytest.approx(0.25)
    pod = rows[("pod:delta=0", 0.9)]
    assert 0.85 < pod["stored_share"] <= 0.9 + 1e-9 and pod["solved_budget"] < 0.9 * 64
    assert "out of reach" in rows[("pod:delta=0", 0.25)]["error"]
    assert out["config"]["memory_shares"] == [0.25, 0.9]
    with pytest.raises(protokv.Error, match="budget or kv_memory_share"):
        protokv.eval.fidelity(recall, text, ["snapkv"], samples=1)


def test_eval_fidelity_with_a_quantised_cache(recall):
    # The reference stays F32: the full row measures the cache type's own cost, and every row
    # stores q8_0 rows (34 bytes for 32 values instead of 128), with shared prefill or without.
    # A memory share is of the full cache of the same type (stored_share, over the F32
    # reference, is then the product): snapkv stores exactly its share, pod's is solved.
    text = PROMPT * 30
    q8 = 34 / 128
    runs = {share: protokv.eval.fidelity(recall, text, ["full", "snapkv", "pod:delta=0"], [16],
                                         kv_memory_shares=[0.9], samples=2, prompt_len=64,
                                         continuation=4, share_prefill=share,
                                         cache_type_k="q8_0", cache_type_v="q8_0")
            for share in (False, True)}
    for out in runs.values():
        assert out["config"]["cache_type_k"] == out["config"]["cache_type_v"] == "q8_0"
        rows = {(r["press"], r.get("memory_share")): r for r in out["results"]}
        full = rows[("full", None)]
        assert 0.0 < full["kl_mean"] < 0.05
        assert full["stored_share"] == pytest.approx(q8)
        # Decode reads the stored rows (and the continuation's few more), in q8_0 bytes too.
        assert full["attended_share"] == pytest.approx(q8, rel=0.1)
        assert rows[("snapkv", 0.9)]["stored_share"] == pytest.approx(57 / 64 * q8)  # floor(0.9 n)
        assert 0.85 * q8 < rows[("pod:delta=0", 0.9)]["stored_share"] <= 0.9 * q8 + 1e-9
    assert runs[False]["results"][1]["per_sample"] == runs[True]["results"][1]["per_sample"]
    with pytest.raises(protokv.Error, match="unknown KV cache type"):
        protokv.eval.fidelity(recall, text, ["full"], [16], samples=1, cache_type_v="q8_1")


def test_kernel_variants_name_the_active_one():
    import os

    variants = protokv.kernel_variants()
    assert variants["available"][0] == "scalar"
    assert variants["active"] in variants["available"]
    requested = os.environ.get("PROTOKV_ISA", "")
    # ctest runs this suite with PROTOKV_ISA=scalar and =avx2 too: the override must take.
    assert variants["active"] == (requested or variants["available"][-1])


def test_kernel_variants_name_the_openblas_core():
    assert protokv.kernel_variants()["openblas_core"] == protokv._core.blas_core()[0] != ""


def test_narrower_openblas_kernels_than_the_cpu_runs_are_a_warning(monkeypatch):
    import warnings

    monkeypatch.setattr(protokv._core, "blas_core", lambda: ("Prescott", "SkylakeX"))
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    with pytest.warns(RuntimeWarning, match="OPENBLAS_CORETYPE=SkylakeX"):
        protokv._warn_about_openblas_core()
    # Named by the user, or already the best: nothing to say.
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        protokv._warn_about_openblas_core()
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.setattr(protokv._core, "blas_core", lambda: ("SkylakeX", ""))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        protokv._warn_about_openblas_core()


def test_an_unknown_protokv_isa_is_one_clear_error(recall_path, protokv_cli):
    import os
    import sys

    env = dict(os.environ, PROTOKV_ISA="bogus")
    cli = subprocess.run([protokv_cli, "generate", "-m", recall_path, "-p", "hi", "-n", "2"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert cli.returncode == 1
    assert cli.stderr.count("\n") == 1 and "PROTOKV_ISA=bogus" in cli.stderr
    py = subprocess.run(
        [sys.executable, "-c",
         "import protokv\n"
         "try:\n"
         f"    protokv.Model({recall_path!r})\n"
         "except protokv.Error as e:\n"
         "    print(e)\n"],
        capture_output=True, text=True, timeout=60, env=env)
    assert py.returncode == 0 and "PROTOKV_ISA=bogus" in py.stdout, py.stderr


def test_llama_cpp_arithmetic_or_f32_prompts(recall):
    # The recall model's weights are F16: llama_cpp_arithmetic=True computes as llama.cpp does
    # (F16 prompt activations, its RoPE, SwiGLU and attention orders); by default prompts stay
    # F32 (as transformers), which moves the logits by those roundings only.
    ids = recall.tokenize(PROMPT, add_bos=True, special=True)
    rounded = recall.session(llama_cpp_arithmetic=True).prefill(ids).copy()
    f32 = recall.session().prefill(ids).copy()
    assert not np.array_equal(rounded, f32)
    assert np.abs(rounded - f32).max() < 0.1
    # llama.cpp's flash attention (its CPU default) reads K/V as F16, whatever the cache holds.
    flash = recall.session(llama_cpp_arithmetic=True, llama_cpp_flash_attention=True)
    flash_logits = flash.prefill(ids).copy()
    f16_cache = recall.session(llama_cpp_arithmetic=True, llama_cpp_flash_attention=True,
                               cache_type_k="f16", cache_type_v="f16")
    assert np.array_equal(flash_logits, f16_cache.prefill(ids))
    assert not np.array_equal(flash_logits, rounded)
    assert np.abs(flash_logits - rounded).max() < 0.1
    with pytest.raises(protokv.Error, match="needs llama_cpp_arithmetic"):
        recall.session(llama_cpp_flash_attention=True)
    with pytest.raises(protokv.Error, match="llama_cpp_threads"):
        recall.session(llama_cpp_arithmetic=True, llama_cpp_flash_attention=True,
                       llama_cpp_threads=0)
