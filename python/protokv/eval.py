# SPDX-License-Identifier: Apache-2.0
"""protokv's evaluations from Python, returning the dicts the CLI prints with ``--json``.

Every function takes the same samples for every (press, budget), as the CLI does, so the
paired differences against ``reference`` (95% intervals) compare methods on equal footing.
``progress`` draws a tqdm bar when tqdm is installed (``pip install tqdm``), else the engine's
own one-line bar on stderr; by default only when stderr is a terminal. A callable gets
``(done, total, detail)`` after each step instead; an exception it raises (KeyboardInterrupt
included) stops the evaluation.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _core
from .presses import Press, ScorerPress

__all__ = ["fidelity", "niah", "ruler", "longbench", "merge"]

ProgressArg = Union[None, bool, Callable[[int, int, str], Any]]
PressArg = Union[str, Press, ScorerPress]


def _spec(press: Union[str, Press], what: str) -> str:
    if isinstance(press, Press):
        if press.alloc:
            raise _core.Error(f"eval.{what} takes one allocator for all presses: alloc=")
        return press.spec
    if not isinstance(press, str):
        raise TypeError(f"eval.{what} takes press specs or protokv.presses objects, got "
                        f"{type(press).__name__}")
    return press


class _TqdmProgress:
    """A tqdm bar fed by the engine's (done, total, detail) steps."""

    def __init__(self, tqdm: Any, label: str) -> None:
        self._tqdm = tqdm
        self._label = label
        self._bar: Any = None

    def __call__(self, done: int, total: int, detail: str) -> None:
        if self._bar is None:
            self._bar = self._tqdm(total=total, desc=self._label, unit="step")
        self._bar.update(done - self._bar.n)
        if detail:
            self._bar.set_postfix_str(detail, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _progress(progress: ProgressArg, label: str) -> Tuple[bool, Optional[Callable], Any]:
    """(engine bar on, callback, object to close) for a ``progress`` argument."""
    if callable(progress):
        return True, progress, None
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return False, None, None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return True, None, None  # the engine's own bar on stderr
    bar = _TqdmProgress(tqdm, label)
    return True, bar, bar


def _run_with_progress(progress: ProgressArg, label: str, call: Callable[[bool, Any], Any]) -> Any:
    enabled, callback, closer = _progress(progress, label)
    try:
        return call(enabled, callback)
    finally:
        if closer is not None:
            closer.close()


def fidelity(model: Any, text: str, presses: Sequence[Union[str, Press]],
             budgets: Sequence[int] = (), *, kv_memory_shares: Sequence[float] = (),
             samples: int = 8, prompt_len: int = 512,
             continuation: int = 64, alloc: str = "", reference: str = "",
             attention_metrics: bool = True, share_prefill: bool = False,
             out: Optional[Union[str, os.PathLike]] = None, resume: bool = False,
             shard: str = "", progress: ProgressArg = None, cache_type_k: str = "f32",
             cache_type_v: str = "f32") -> Dict[str, Any]:
    """``protokv eval fidelity``: every (press, budget) against the full cache on the same
    ``samples`` prompts cut from ``text`` (``prompt_len`` tokens, then ``continuation`` tokens
    teacher-forced): KL, top-1 agreement, perplexity, attention error and recall, KV bytes, and
    paired differences with 95% intervals against ``reference`` (default: snapkv when given,
    else the full cache). ``kv_memory_shares`` adds rows at equal memory: per sample and press,
    the budget at which the press stores that share of the full cache's KV bytes (each row
    reports ``stored_share`` and ``attended_share``). ``cache_type_k`` / ``cache_type_v`` store
    every press run's keys / values as f16, bf16, q8_0 or q4_0 (``--cache-type-k/-v``; the
    reference stays F32, so a ``full`` row measures the type's own cost). ``out`` writes ``fidelity_<model>_p<P>_c<M>_s<S>/`` there (results.json,
    config.json, plots, and samples.jsonl as each sample finishes), where ``resume=True``
    continues a stopped run; ``shard="I/N"`` runs every N-th sample only (the folder gets
    ``_shard<I>of<N>``; ``merge`` joins the N folders). Returns ``{"config": ...,
    "results": [...]}``, as ``--json``.
    Presses written in Python (``ScorerPress``) run in ``niah``, ``ruler``, ``longbench`` and
    ``Model.session()``."""
    specs = [_spec(p, "fidelity") for p in presses]
    return _run_with_progress(progress, "eval fidelity", lambda on, callback: _core.eval_fidelity(
        model._model, text, specs, [int(b) for b in budgets],
        [float(m) for m in kv_memory_shares], alloc, str(cache_type_k), str(cache_type_v),
        int(samples),
        int(prompt_len), int(continuation), reference, bool(attention_metrics),
        bool(share_prefill), os.fspath(out) if out is not None else "", bool(resume), str(shard),
        on, callback))


def _longctx(label: str, presses: Sequence[PressArg], budgets: Sequence[int],
             ratios: Sequence[float], memory_shares: Sequence[float], alloc: str, mode: str,
             reference: str, limit: int,
             out: Optional[Union[str, os.PathLike]], resume: bool, share_prefill: bool,
             batch_decode: bool, shard: str, progress: ProgressArg,
             call: Callable[[Dict[str, Any]], Tuple[Dict[str, Any], str]],
             cache_type_k: str, cache_type_v: str) -> Dict[str, Any]:
    if isinstance(presses, (str, Press, ScorerPress)):
        presses = [presses]
    engine_presses: List[Any] = []
    for p in presses:
        if isinstance(p, ScorerPress):
            engine_presses.append(p._handle())
        else:
            engine_presses.append(_spec(p, label))

    def run(on: bool, callback: Any) -> Dict[str, Any]:
        results, _text = call({
            "presses": engine_presses, "budgets": [int(b) for b in budgets],
            "ratios": [float(r) for r in ratios],
            "memory_shares": [float(m) for m in memory_shares], "alloc": alloc, "mode": mode,
            "reference": reference, "limit": int(limit),
            "out": os.fspath(out) if out is not None else "", "resume": bool(resume),
            "share_prefill": bool(share_prefill), "batch_decode": bool(batch_decode),
            "shard": str(shard), "progress": on, "progress_callback": callback,
            "cache_type_k": str(cache_type_k), "cache_type_v": str(cache_type_v),
        })
        return results

    return _run_with_progress(progress, "eval " + label, run)


_LONGCTX_DOC = """
    Common arguments (as the CLI's flags): ``presses`` are press specs (``"snapkv:window=8"``),
    ``protokv.presses`` objects or presses written in Python (``ScorerPress`` subclasses), each
    run at every ``budgets`` entry (KV entries per head), every ``ratios`` share of the
    prompt and every ``kv_memory_shares`` share of the full cache's KV bytes (equal memory: each
    sample's budget solved per press so that it stores that share; runs labelled
    ``press@mS``); ``"full"`` is the uncompressed reference. ``alloc`` is the allocator of the spec
    presses; ``mode`` is ``"query-aware"`` (the question is compressed with the context) or
    ``"query-agnostic"`` (context compressed first, question appended after); ``reference``
    labels the run the others are paired against; ``limit`` keeps the first N samples (0: all);
    ``out`` writes results.json, config.json, samples.jsonl (and figures) to a folder, where
    ``resume=True`` continues an interrupted run; ``share_prefill`` runs each prompt through the
    model once for all runs and ``batch_decode`` decodes a sample's runs together, one batched
    forward pass per token (the same records, faster; ``decode_ms`` is then the batch's time);
    ``shard="I/N"`` runs every N-th sample only, from the I-th, for a job array (``merge``
    joins the N ``out`` folders into one run's report); ``cache_type_k`` / ``cache_type_v``
    store every run's keys / values (the reference's too) in ``"f32"``, ``"f16"``, ``"bf16"``,
    ``"q8_0"`` or ``"q4_0"`` rows (llama.cpp's -ctk / -ctv). Returns the dict ``--json``
    prints.
"""


def niah(model: Any, presses: Sequence[PressArg] = ("full",), budgets: Sequence[int] = (),
         ratios: Sequence[float] = (), *, kv_memory_shares: Sequence[float] = (),
         lengths: Sequence[int] = (), depths: Sequence[float] = (), samples: int = 1, max_new_tokens: int = 16,
         needle: str = "The special magic number for {key} is {value}.",
         question: str = ("\nWhat is the special magic number for {key}? "
                          "The special magic number for {key} is"),
         haystack: str = "", haystack_kind: str = "noise", seed: int = 42, alloc: str = "",
         mode: str = "query-aware", reference: str = "full", limit: int = 0,
         out: Optional[Union[str, os.PathLike]] = None, resume: bool = False,
         share_prefill: bool = False, batch_decode: bool = False, shard: str = "",
         progress: ProgressArg = None, cache_type_k: str = "f32",
         cache_type_v: str = "f32") -> Dict[str, Any]:
    """``protokv eval niah``: needle in a haystack over a grid of ``lengths`` (prompt tokens;
    default: geometric up to the model's context) x ``depths`` (percent; default 0, 10, ...,
    100), ``samples`` key/value pairs per cell, greedy answer scored by exact containment of the
    needle's value. ``haystack`` is filler text (repeated / cut to length); without it
    ``haystack_kind`` picks ``"noise"`` (RULER's sentences) or ``"model"`` (sampled text).
    The result has ``summary``, ``cells`` (accuracy per length and depth, per run) and
    ``per_length_paired``; with ``out``, one heat-map SVG per run.
    """
    return _longctx("niah", presses, budgets, ratios, kv_memory_shares, alloc, mode, reference,
                    limit, out, resume,
                    share_prefill, batch_decode, shard, progress, lambda run: _core.eval_niah(
                        model._model, run, [int(x) for x in lengths],
                        [float(x) for x in depths], needle, question, int(max_new_tokens),
                        int(samples), haystack, haystack_kind, int(seed)), cache_type_k, cache_type_v)


def ruler(model: Any, presses: Sequence[PressArg] = ("full",), budgets: Sequence[int] = (),
          ratios: Sequence[float] = (), *, kv_memory_shares: Sequence[float] = (),
          tasks: Sequence[str] = (),
          lengths: Sequence[int] = (), samples: int = 4, haystack: str = "", squad: str = "",
          hotpotqa: str = "", seed: int = 42, alloc: str = "", mode: Optional[str] = None,
          reference: Optional[str] = None, limit: int = 0,
          out: Optional[Union[str, os.PathLike]] = None, resume: bool = False,
          share_prefill: bool = False, batch_decode: bool = False, shard: str = "",
          protocol: str = "", progress: ProgressArg = None, cache_type_k: str = "f32",
          cache_type_v: str = "f32") -> Dict[str, Any]:
    """``protokv eval ruler``: RULER's synthetic tasks (default: the eleven; ``qa_1`` /
    ``qa_2`` with ``squad`` / ``hotpotqa`` file paths) at ``lengths`` (prompt + generated
    tokens; default from the model's context), ``samples`` per task and length, scored as
    RULER (x100 in the tables, [0, 1] in ``summary``). ``haystack`` is the essay text (RULER:
    Paul Graham's essays; default: repeated noise). ``mode`` defaults to ``"query-aware"``,
    ``reference`` to ``"full"``. The result has ``summary``, ``per_task``, ``per_task_paired``
    (and ``per_length`` with several lengths).
    ``protocol="kvpress"`` is kvpress's leaderboard protocol (as ``--protocol kvpress``):
    query-agnostic, 4096 tokens (or the model's context), compression ratios 0.25 / 0.5 / 0.75
    / 0.875 (kept shares 0.75 .. 0.125) for every press, paired against the full cache (added
    when missing); it fixes ``budgets``, ``ratios``, ``kv_memory_shares``, ``lengths``, ``mode``
    and ``reference`` (an error when given). The result then also has
    ``by_compression_ratio``: per press, per ratio, the score and its paired difference.
    """
    if not protocol:
        mode = "query-aware" if mode is None else mode
        reference = "full" if reference is None else reference
    return _longctx("ruler", presses, budgets, ratios, kv_memory_shares, alloc, mode or "",
                    reference or "", limit, out, resume,
                    share_prefill, batch_decode, shard, progress, lambda run: _core.eval_ruler(
                        model._model, run, list(tasks), [int(x) for x in lengths], int(samples),
                        haystack, os.fspath(squad), os.fspath(hotpotqa), int(seed),
                        str(protocol)), cache_type_k, cache_type_v)


def longbench(model: Any, data: Union[str, os.PathLike], presses: Sequence[PressArg] = ("full",),
              budgets: Sequence[int] = (), ratios: Sequence[float] = (), *,
              kv_memory_shares: Sequence[float] = (), datasets: Sequence[str] = (), e: bool = False, max_length: int = 0,
              alloc: str = "", mode: str = "query-aware", reference: str = "full",
              limit: int = 0, out: Optional[Union[str, os.PathLike]] = None,
              resume: bool = False, share_prefill: bool = False, batch_decode: bool = False,
              shard: str = "", progress: ProgressArg = None, cache_type_k: str = "f32",
              cache_type_v: str = "f32") -> Dict[str, Any]:
    """``protokv eval longbench``: LongBench (or LongBench-E with ``e=True``) on the official
    JSONL files in the folder ``data`` (default: every dataset found; ``limit`` then counts per
    dataset), with the official prompts, max new tokens and metrics, prompts cut in the middle
    to ``max_length`` tokens (0: a prompt beyond the context is an error). The result has
    ``summary``, ``per_dataset`` (and ``per_dataset_length`` for -E).
    """
    return _longctx("longbench", presses, budgets, ratios, kv_memory_shares, alloc, mode,
                    reference, limit, out,
                    resume, share_prefill, batch_decode, shard, progress,
                    lambda run: _core.eval_longbench(
                        model._model, run, os.fspath(data), list(datasets), bool(e),
                        int(max_length)), cache_type_k, cache_type_v)


for _f in (niah, ruler, longbench):
    _f.__doc__ = (_f.__doc__ or "") + _LONGCTX_DOC
del _f


def merge(dirs: Sequence[Union[str, os.PathLike]],
          out: Optional[Union[str, os.PathLike]] = None) -> Dict[str, Any]:
    """``protokv eval merge``: the output folders of a sharded run (``shard="1/N"`` ..
    ``"N/N"`` of ``fidelity``, ``niah``, ``ruler`` or ``longbench``, each finished) joined into
    the report one run over every sample gives: the same records in the same order, so the
    same tables and paired intervals. ``out`` writes the merged folder. Returns the dict
    ``--json`` prints."""
    if isinstance(dirs, (str, os.PathLike)):
        dirs = [dirs]
    return _core.eval_merge([os.fspath(d) for d in dirs],
                            os.fspath(out) if out is not None else "")
