# SPDX-License-Identifier: Apache-2.0
"""protokv.eval.niah / ruler / longbench: the CLI's reports from Python, presses written in
Python run end to end, progress, bad input; and s.kv() against `generate --json`."""

import json
import pathlib
import subprocess

import numpy as np
import pytest

import protokv

REPO = pathlib.Path(__file__).resolve().parents[2]
LONGBENCH = REPO / "tests" / "data" / "longbench"
TIMING = ("_ms",)


def run_cli(cli, *args):
    out = subprocess.run([cli, *args, "--json", "--quiet", "-t", "2"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def same_report(py, ref):
    """Equal but for timings and the process's own facts (thread count, wall time)."""
    assert set(py) == set(ref)
    assert all(s["scored"] > 0 for s in py["summary"]), py["skipped"][:1]
    for key in py:
        if key in ("wall_ms", "config"):
            continue
        assert strip_timing(py[key]) == strip_timing(ref[key]), key
    assert set(py["config"]) == set(ref["config"])
    for key in py["config"]:
        if key != "threads":
            assert py["config"][key] == ref["config"][key], key


def strip_timing(value):
    if isinstance(value, dict):
        return {k: strip_timing(v) for k, v in value.items() if not k.endswith(TIMING)}
    if isinstance(value, list):
        return [strip_timing(v) for v in value]
    return value


class KNorm(protokv.ScorerPress):
    """Keeps the keys of smallest norm (kvpress's KnormPress): score = -||k||."""

    calls = 0

    def score(self, keys, values, window_queries, positions):
        KNorm.calls += 1
        return -np.linalg.norm(keys, axis=-1)


def test_niah_returns_the_clis_report(recall, recall_path, protokv_cli):
    ref = run_cli(protokv_cli, "eval", "niah", "-m", recall_path, "--press", "full,snapkv,h2o",
                  "--budget", "32", "--lengths", "160,256", "--depths", "0,50,100")
    py = protokv.eval.niah(recall, ["full", "snapkv", protokv.presses.H2O()], [32],
                           lengths=[160, 256], depths=[0, 50, 100], progress=False)
    same_report(py, ref)
    assert [s["run"] for s in py["summary"]] == ["full", "snapkv@32", "h2o@32"]
    assert len(py["cells"]["snapkv@32"]) == 2 * 3
    # One shared prefill and batched decoding per sample: the same answers.
    fast = protokv.eval.niah(recall, ["full", "snapkv", protokv.presses.H2O()], [32],
                             lengths=[160, 256], depths=[0, 50, 100], share_prefill=True,
                             batch_decode=True, progress=False)
    assert fast["config"]["share_prefill"] is True and fast["config"]["batch_decode"] is True
    for key in ("cells", "per_length_paired"):
        assert fast[key] == py[key], key
    # (the peak KV differs: a shared prefill holds the full cache once for every press)
    assert ([(s["run"], s["score"], s["kv_bytes"]) for s in fast["summary"]] ==
            [(s["run"], s["score"], s["kv_bytes"]) for s in py["summary"]])


def test_ruler_kvpress_protocol_is_the_clis(recall, recall_path, protokv_cli):
    # kvpress's leaderboard protocol: the same runs, report and by-ratio table as the CLI's.
    ref = run_cli(protokv_cli, "eval", "ruler", "-m", recall_path, "--protocol", "kvpress",
                  "--press", "snapkv", "--tasks", "niah_single_1", "--samples", "2")
    py = protokv.eval.ruler(recall, ["snapkv"], protocol="kvpress", tasks=["niah_single_1"],
                            samples=2, progress=False)
    same_report(py, ref)
    assert [s["run"] for s in py["summary"]] == [
        "full", "snapkv@r0.75", "snapkv@r0.5", "snapkv@r0.25", "snapkv@r0.125"]
    assert py["config"]["protocol"]["name"] == "kvpress"
    assert py["config"]["mode"] == "query-agnostic"
    assert set(py["by_compression_ratio"]["snapkv"]) == {"0.25", "0.5", "0.75", "0.875"}
    for fixed in ({"budgets": [64]}, {"ratios": [0.5]}, {"kv_memory_shares": [0.5]},
                  {"lengths": [512]}, {"mode": "query-agnostic"}, {"reference": "full"}):
        with pytest.raises(protokv.Error, match="the kvpress protocol fixes"):
            protokv.eval.ruler(recall, ["snapkv"], protocol="kvpress", samples=1,
                               progress=False, **fixed)
    with pytest.raises(protokv.Error, match="not a known protocol"):
        protokv.eval.ruler(recall, ["snapkv"], [64], protocol="nope", progress=False)


def test_ruler_and_longbench_return_the_clis_reports(recall, recall_path, protokv_cli):
    args = ["--press", "full,streaming_llm", "--budget", "24"]
    ref = run_cli(protokv_cli, "eval", "ruler", "-m", recall_path, *args, "--tasks",
                  "niah_single_1,vt", "--lengths", "512,768", "--samples", "2")
    py = protokv.eval.ruler(recall, ["full", "streaming_llm"], [24],
                            tasks=["niah_single_1", "vt"], lengths=[512, 768], samples=2,
                            progress=False)
    same_report(py, ref)
    assert set(py["per_task"]["streaming_llm@24"]) == {"niah_single_1", "vt", "average"}
    ref = run_cli(protokv_cli, "eval", "longbench", "-m", recall_path, *args, "--data",
                  str(LONGBENCH), "--datasets", "trec,samsum", "--max-length", "200")
    py = protokv.eval.longbench(recall, LONGBENCH, ["full", "streaming_llm"], [24],
                                datasets=["trec", "samsum"], max_length=200, progress=False)
    same_report(py, ref)


def test_a_python_press_runs_end_to_end_in_niah(recall, tmp_path):
    KNorm.calls = 0
    out = protokv.eval.niah(recall, ["full", KNorm(window=4)], [32], lengths=[160, 256],
                            depths=[0, 100], out=tmp_path, progress=False)
    full, knorm = out["summary"]
    assert knorm["run"] == "KNorm@32"
    assert knorm["scored"] == full["scored"] == 4 and knorm["skipped"] == 0
    assert knorm["kv_bytes"] < full["kv_bytes"]
    assert knorm["paired"] == 4  # paired against the full cache on every sample
    # One call per layer per sample.
    assert KNorm.calls == 4 * recall.n_layers
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sum(r.get("run") == "KNorm@32" for r in records) == 4
    assert (tmp_path / "heatmap_KNorm@32.svg").exists()
    assert json.loads((tmp_path / "results.json").read_text())["summary"] == out["summary"]
    # A budget at least the prompt keeps everything: the same answers as the full cache.
    out = protokv.eval.niah(recall, ["full", KNorm()], [2048], lengths=[160], depths=[50],
                            progress=False)
    full, knorm = out["summary"]
    assert knorm["scored"] == 1 and knorm["kv_bytes"] == full["kv_bytes"]
    assert knorm["diff_vs_reference"] == 0.0


def test_progress_reaches_the_total_and_can_stop_the_run(recall):
    steps = []
    protokv.eval.niah(recall, ["full", "snapkv"], [32], lengths=[160], depths=[0, 100],
                      progress=lambda done, total, detail: steps.append((done, total, detail)))
    assert steps[-1][0] == steps[-1][1] == 2 * 2
    assert any("snapkv@32" in detail for _, _, detail in steps)

    def stop(done, total, detail):
        if done >= 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        protokv.eval.niah(recall, ["full"], lengths=[160], depths=[0, 50, 100], progress=stop)
    # Fidelity takes a callback too.
    steps.clear()
    protokv.eval.fidelity(recall, "the clerk kept the ledger. " * 40, ["snapkv"], [16],
                          samples=2, prompt_len=48, continuation=4,
                          progress=lambda d, t, s: steps.append((d, t)))
    assert steps[-1] == (2 * 2, 2 * 2)


def test_a_tqdm_bar_when_tqdm_is_installed(recall, capfd):
    pytest.importorskip("tqdm")
    protokv.eval.niah(recall, ["full"], lengths=[160], depths=[0, 100], progress=True)
    err = capfd.readouterr().err
    assert "eval niah" in err and "2/2" in err


def test_bad_input_raises(recall, tmp_path):
    with pytest.raises(protokv.Error, match="nope"):
        protokv.eval.niah(recall, ["nope"], [16], lengths=[64], progress=False)
    with pytest.raises(protokv.Error, match="budgets must be > 0"):
        protokv.eval.niah(recall, ["snapkv"], [0], lengths=[64], progress=False)
    with pytest.raises(protokv.Error, match="needs at least one budget"):
        protokv.eval.niah(recall, ["snapkv"], lengths=[64], progress=False)
    with pytest.raises(protokv.Error, match="mode"):
        protokv.eval.niah(recall, ["full"], lengths=[64], mode="sideways", progress=False)
    with pytest.raises(protokv.Error, match="twice"):
        protokv.eval.niah(recall, ["snapkv", "snapkv"], [16], lengths=[64], progress=False)
    with pytest.raises(protokv.Error, match="own allocator"):
        protokv.eval.niah(recall, [KNorm()], [16], lengths=[64], alloc="pyramid",
                          progress=False)
    with pytest.raises(protokv.Error, match="context"):
        protokv.eval.niah(recall, ["full"], lengths=[10**7], progress=False)
    with pytest.raises(protokv.Error, match="depths"):
        protokv.eval.niah(recall, ["full"], lengths=[64], depths=[101], progress=False)
    with pytest.raises(protokv.Error, match="resum"):
        protokv.eval.ruler(recall, ["full"], lengths=[128], resume=True, progress=False)
    with pytest.raises(protokv.Error, match="qa_1"):
        protokv.eval.ruler(recall, ["full"], tasks=["qa_1"], lengths=[128], progress=False)
    with pytest.raises(protokv.Error, match="not a directory"):
        protokv.eval.longbench(recall, tmp_path / "missing", ["full"], progress=False)
    with pytest.raises(protokv.Error, match="no_such_dataset"):
        protokv.eval.longbench(recall, LONGBENCH, ["full"], datasets=["no_such_dataset"],
                               progress=False)
    with pytest.raises(TypeError):
        protokv.eval.niah(recall, [42], [16], lengths=[64], progress=False)
    with pytest.raises(TypeError):
        protokv.eval.fidelity(recall, "text " * 50, [KNorm()], [16])


def test_kv_matches_what_generate_json_keeps(recall, recall_path, protokv_cli):
    prompt = ("The ledger of crate 4821 was kept by the clerk. The clerk kept the ledger of "
              "crate 4821 in the office on Mondays and Fridays.")
    for press, n in (("snapkv", 0), ("h2o", 3), ("protokv", 2)):
        ref = subprocess.run(
            [protokv_cli, "generate", "-m", recall_path, "-p", prompt, "--press", press,
             "--budget", "16", "-n", str(n), "--json", "--kv-positions", "-t", "2"],
            capture_output=True, text=True, timeout=120, check=True)
        ref = json.loads(ref.stdout)
        s = recall.session(press=press, budget=16)
        s.prefill(recall.tokenize(prompt))
        # generate decodes every generated token but the last.
        for token in ref["generated_tokens"][:-1]:
            s.decode(token)
        assert s.kv_bytes() == ref["kv_bytes_end"]
        for layer, heads in enumerate(ref["kv_positions"]):
            kv = s.kv(layer)
            assert len(kv) == len(heads) == recall.n_kv_heads
            for head, positions in zip(kv, heads):
                assert head["positions"].tolist() == positions, (press, layer)
                n_kept = len(positions)
                assert head["keys"].shape == head["values"].shape == (n_kept, recall.head_dim)


def test_shards_merge_to_the_report_of_one_run(recall, tmp_path):
    args = dict(presses=["full", "snapkv"], budgets=[32], lengths=[160, 256], depths=[0, 50, 100])
    whole = protokv.eval.niah(recall, **args)
    for i in (1, 2):
        part = protokv.eval.niah(recall, shard=f"{i}/2", out=tmp_path / f"s{i}", **args)
        assert part["config"]["shard"] == {"index": i, "count": 2, "samples": 6}
    merged = protokv.eval.merge([tmp_path / "s2", tmp_path / "s1"], out=tmp_path / "m")
    assert merged.pop("merged_from") == [str(tmp_path / "s2"), str(tmp_path / "s1")]
    same_report(merged, whole)
    assert (tmp_path / "m" / "samples.jsonl").is_file()
    with pytest.raises(protokv.Error, match="shard 2/2 is missing"):
        protokv.eval.merge(tmp_path / "s1")
    with pytest.raises(protokv.Error, match="is not I/N"):
        protokv.eval.niah(recall, shard="3/2", **args)


def test_equal_memory_runs_store_the_asked_share(recall):
    # pod with delta=0 keeps every value and layer 0's keys (3/4 of the recall model's cache):
    # its solved budget is far below 0.9 x the prompt, snapkv's is 0.9 x the prompt.
    out = protokv.eval.niah(recall, ["full", "snapkv", "pod:delta=0"], kv_memory_shares=[0.9],
                            lengths=[256], depths=[0, 100], progress=False)
    full, snapkv, pod = out["summary"]
    assert (snapkv["run"], pod["run"]) == ("snapkv@m0.9", "pod:delta=0@m0.9")
    assert abs(full["stored_share"] - 1.0) < 1e-9
    for run in (snapkv, pod):
        assert run["scored"] == 2 and run["skipped"] == 0
        assert 0.85 < run["stored_share"] <= 0.9 + 1e-9
    # clusterkv stores every entry: the share is out of reach, the sample skipped with the reason.
    out = protokv.eval.niah(recall, ["clusterkv"], kv_memory_shares=[0.5], lengths=[256],
                            depths=[0], progress=False)
    assert out["summary"][0]["skipped"] == 1
    assert "out of reach" in out["skipped"][0]["error"]


def test_cache_types_store_every_run_in_their_rows(recall):
    # q8_0 rows: 34 bytes per 32 values instead of 128; the reference stores them too.
    kwargs = dict(lengths=[256], depths=[50], progress=False)
    f32 = protokv.eval.niah(recall, ["full", "snapkv"], [32], **kwargs)
    q8 = protokv.eval.niah(recall, ["full", "snapkv"], [32], cache_type_k="q8_0",
                           cache_type_v="q8_0", **kwargs)
    assert q8["config"]["cache_type_k"] == q8["config"]["cache_type_v"] == "q8_0"
    for a, b in zip(f32["summary"], q8["summary"]):
        assert b["kv_bytes"] * 128 == a["kv_bytes"] * 34, b["run"]
    with pytest.raises(protokv.Error, match="unknown KV cache type 'q4_1'"):
        protokv.eval.ruler(recall, ["full"], cache_type_v="q4_1", progress=False)
