"""protokv's evaluations from Python, returning the dicts the CLI prints with ``--json``."""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Sequence, Union

from . import _core
from .presses import Press

__all__ = ["fidelity"]


def _spec(press: Union[str, Press]) -> str:
    if isinstance(press, Press):
        if press.alloc:
            raise _core.Error("eval.fidelity takes one allocator for all presses: alloc=")
        return press.spec
    if not isinstance(press, str):
        raise TypeError("eval.fidelity takes press specs or protokv.presses objects "
                        "(a ScorerPress runs through Model.session())")
    return press


def fidelity(model: Any, text: str, presses: Sequence[Union[str, Press]],
             budgets: Sequence[int], *, samples: int = 8, prompt_len: int = 512,
             continuation: int = 64, alloc: str = "", reference: str = "",
             attention_metrics: bool = True, share_prefill: bool = False,
             progress: Optional[bool] = None) -> Dict[str, Any]:
    """``protokv eval fidelity``: every (press, budget) against the full cache on the same
    ``samples`` prompts cut from ``text`` (``prompt_len`` tokens, then ``continuation`` tokens
    teacher-forced): KL, top-1 agreement, perplexity, attention error and recall, KV bytes, and
    paired differences with 95% intervals against ``reference`` (default: the full cache).
    Returns ``{"config": ..., "results": [...]}``, as ``--json``. ``progress`` (default: when
    stderr is a terminal) reports progress on stderr."""
    if progress is None:
        progress = sys.stderr.isatty()
    return _core.eval_fidelity(model._model, text, [_spec(p) for p in presses],
                               [int(b) for b in budgets], alloc, int(samples), int(prompt_len),
                               int(continuation), reference, bool(attention_metrics),
                               bool(share_prefill), bool(progress))
