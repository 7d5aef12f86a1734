# SPDX-License-Identifier: Apache-2.0
"""protokv: LLM inference on GGUF models with a compressed KV cache, from Python.

``Model`` loads a GGUF file and generates in llama-cpp-python's shapes (``llm(prompt)``,
``create_completion``, ``create_chat_completion``, OpenAI-shaped dicts, streaming as a
generator); ``press=`` and ``budget=`` compress the prompt's KV cache inside the engine, so the
memory is really freed. ``Model.session()`` is the lower level: prefill, append, decode, logits as
numpy arrays and the compressed cache itself (``Session.kv``). Presses are named by their spec
string (``"snapkv:window=16"``) or by objects of ``protokv.presses``.

Errors of the library (a bad model file, an unknown press, a prompt longer than the context)
raise ``protokv.Error``, a ``ValueError``.
"""

from __future__ import annotations

import codecs
import os
import time
import uuid
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _core, eval, presses
from ._core import Error
from .presses import Press, ScorerPress, list_presses

__all__ = ["Model", "Session", "Error", "Press", "ScorerPress", "eval", "presses",
           "list_presses", "kernel_variants", "__version__"]
__version__: str = _core.__version__
Error.__doc__ = ("An error of the library, with its one-line message: a bad model file, an "
                 "unknown press or option, a prompt longer than the context (a ValueError).")

PressArg = Union[str, Press, ScorerPress, None]


def kernel_variants() -> Dict[str, Any]:
    """The CPU kernel variants: ``{"available": [...], "active": name, "openblas_core": name}``.

    ``available`` lists the variants this CPU runs, scalar first (``scalar``, ``avx2``,
    ``avx512``); ``active`` is the one every kernel uses: the widest, or the one the environment
    variable ``PROTOKV_ISA`` names. ``openblas_core`` is the core type whose GEMM kernels OpenBLAS
    runs (the prompt's matrix products). Raises :class:`Error` when ``PROTOKV_ISA`` names a
    variant this CPU cannot run.
    """
    available, active = _core.kernel_variants()
    return {"available": list(available), "active": active,
            "openblas_core": _core.blas_core()[0]}


def _warn_about_openblas_core() -> None:
    # OpenBLAS picks its kernels when it loads, from a table of CPU models; on a CPU newer than
    # that table it runs SSE3 kernels (prefill measured 2.9-3.7x slower). The protokv CLI starts
    # itself again with OPENBLAS_CORETYPE set; a Python process cannot, so it says what to set.
    chosen, better = _core.blas_core()
    if better and not os.environ.get("OPENBLAS_CORETYPE"):
        warnings.warn(f"OpenBLAS runs its {chosen} kernels on this CPU, which runs its {better} "
                      f"ones (several times faster prompt processing): set "
                      f"OPENBLAS_CORETYPE={better} before starting Python", RuntimeWarning,
                      stacklevel=3)


_warn_about_openblas_core()


def _press_spec(press: PressArg, alloc: Optional[str]) -> tuple[Any, str]:
    if isinstance(press, ScorerPress):
        if alloc:
            raise Error("a ScorerPress takes its allocator when it is made (alloc=...)")
        return press._handle(), ""
    if isinstance(press, Press):
        if alloc and press.alloc and alloc != press.alloc:
            raise Error(f"allocator given twice: {press.alloc!r} and {alloc!r}")
        return press.spec, alloc or press.alloc
    return press, alloc or ""


class Session:
    """One sequence's state: its KV cache (compressed by the press at prefill) and logits.

    Made by ``Model.session()``. Every call that runs the model releases the GIL.
    """

    def __init__(self, model: "Model", press: PressArg = None, budget: Optional[int] = None,
                 ratio: Optional[float] = None, alloc: Optional[str] = None,
                 ubatch: int = 0, compress_local_layers: bool = False,
                 cache_type_k: str = "f32", cache_type_v: str = "f32",
                 llama_cpp_arithmetic: bool = False,
                 llama_cpp_flash_attention: bool = False, llama_cpp_threads: int = 1) -> None:
        spec, alloc_name = _press_spec(press, alloc)
        self.model = model
        self._session = _core.Session(model._model, spec, budget, ratio, alloc_name, ubatch,
                                      compress_local_layers, cache_type_k, cache_type_v,
                                      llama_cpp_arithmetic, llama_cpp_flash_attention,
                                      llama_cpp_threads)

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Runs ``ids`` from position 0 (resetting the session), compresses the cache with the
        press and returns the last token's logits (see ``logits()``)."""
        return self._session.prefill(list(ids))

    def append(self, ids: Sequence[int]) -> np.ndarray:
        """Feeds ``ids`` after what the cache holds (appended in full, never compressed) and
        returns the last one's logits."""
        return self._session.append(list(ids))

    def decode(self, token: int) -> np.ndarray:
        """Feeds one token and returns its logits."""
        return self._session.decode(int(token))

    def logits(self) -> np.ndarray:
        """The logits of the last token run, ``float32[n_vocab]``: a read-only view of the
        engine's buffer (no copy), overwritten by the next prefill/append/decode — ``.copy()``
        it to keep it."""
        return self._session.logits()

    def kv(self, layer: int) -> List[Dict[str, np.ndarray]]:
        """The cache of one layer after compression, one dict per KV head: ``keys`` and
        ``values`` ``float32[n, head_dim]`` (post-RoPE keys), ``positions`` ``int32[n]`` (the
        token positions kept), and ``log_weights`` for merging presses. Copies: the cache's rows
        move as it grows."""
        return self._session.kv(layer)

    def kv_bytes(self) -> int:
        """Bytes of keys and values the cache holds now (all layers and heads)."""
        return self._session.kv_bytes()

    @property
    def n_past(self) -> int:
        """Tokens in the sequence so far (positions used)."""
        return self._session.n_past

    @property
    def press(self) -> str:
        """The press spec this session compresses with (``full``: none)."""
        return self._session.press

    def prefill_stats(self) -> Dict[str, Any]:
        """Of the last prefill: tokens, time, time in the press, peak and stored KV bytes."""
        return self._session.prefill_stats()

    def reset(self) -> None:
        """Empties the cache."""
        self._session.reset()


class _StopMatcher:
    """Holds back text that may be the start of a stop string (OpenAI ``stop``)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached)."""
        self.pending += text
        first = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0),
                    default=-1)
        if first >= 0:
            out, self.pending = self.pending[:first], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


_FINISH_REASONS = {"eos": "stop", "max_tokens": "length", "context_full": "length"}


class Model:
    """A GGUF model (or llama2.c checkpoint) loaded for inference.

    ``Model("model.gguf", n_threads=2, n_ctx=4096)``; ``n_threads=0`` uses every hardware
    thread, ``n_ctx=0`` the model's whole context. ``chat_format`` overrides the chat template
    detected from the file (``chatml``, ``llama3``, ``gemma``, ...).
    """

    def __init__(self, model_path: str, *, n_threads: int = 0, n_ctx: int = 0,
                 chat_format: Optional[str] = None) -> None:
        self._model = _core.Model(str(model_path), n_threads, n_ctx, chat_format or "")
        self.model_path = str(model_path)

    # --- the model ---
    @property
    def n_ctx(self) -> int:
        """Tokens a sequence may hold (prompt + reply)."""
        return self._model.n_ctx

    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
        return self._model.n_vocab

    @property
    def n_layers(self) -> int:
        """Transformer layers (each with its own KV cache)."""
        return self._model.n_layers

    @property
    def n_kv_heads(self) -> int:
        """KV heads per layer (the cache's heads; query heads share them in groups)."""
        return self._model.n_kv_heads

    @property
    def head_dim(self) -> int:
        """Values per key or value vector."""
        return self._model.head_dim

    @property
    def chat_format(self) -> str:
        """The chat template family in use ("" when the file has none protokv knows)."""
        return self._model.chat_format

    def token_bos(self) -> int:
        """The beginning-of-sequence token id."""
        return self._model.token_bos

    def token_eos(self) -> int:
        """The end-of-sequence token id."""
        return self._model.token_eos

    def tokenize(self, text: Union[str, bytes], add_bos: bool = True,
                 special: bool = False) -> List[int]:
        """Token ids of ``text``; ``add_bos`` puts BOS first (where the vocabulary has one),
        ``special`` parses control tokens written in the text (``<|im_start|>``)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return self._model.tokenize(text, add_bos and self._model.token_bos >= 0, special)

    def detokenize(self, ids: Sequence[int]) -> bytes:
        """The bytes of ``ids`` (a leading BOS adds nothing)."""
        return self._model.detokenize(list(ids))

    def session(self, press: PressArg = None, budget: Optional[int] = None,
                ratio: Optional[float] = None, alloc: Optional[str] = None,
                ubatch: int = 0, compress_local_layers: bool = False,
                cache_type_k: str = "f32", cache_type_v: str = "f32",
                llama_cpp_arithmetic: bool = False,
                llama_cpp_flash_attention: bool = False, llama_cpp_threads: int = 1) -> Session:
        """A new ``Session``: ``press`` (spec string or ``protokv.presses`` object; None: full
        cache) keeps ``budget`` entries per KV head per layer, or ``floor(n * ratio)`` of a
        prompt of n tokens; ``alloc`` spreads the budget over heads/layers; ``ubatch`` bounds
        the rows per forward chunk (0: all at once); ``cache_type_k`` / ``cache_type_v`` store
        the keys / values as f32, f16, bf16, q8_0 or q4_0 (llama.cpp's ``-ctk`` / ``-ctv``);
        ``llama_cpp_arithmetic`` computes as llama.cpp's CPU backend does with ``-fa off``
        (logits equal to its own bit for bit on F32 / F16 / legacy-quant llama / qwen files,
        f32 cache, no press; the default False keeps prompt activations in F32, as
        transformers); with it, ``llama_cpp_flash_attention`` attends as llama.cpp's flash
        attention (``-fa on``, its CPU default) over an f32 or f16 cache, split as llama.cpp's
        ``-t llama_cpp_threads`` splits a decode step over 512 cells or more."""
        return Session(self, press, budget, ratio, alloc, ubatch, compress_local_layers,
                       cache_type_k, cache_type_v, llama_cpp_arithmetic,
                       llama_cpp_flash_attention, llama_cpp_threads)

    # --- generation, llama-cpp-python's shapes ---
    def _prompt_ids(self, prompt: Union[str, Sequence[int]]) -> List[int]:
        if isinstance(prompt, str):
            # As `protokv generate`: BOS where the vocabulary wants it (always for an empty
            # prompt), control tokens in the text parsed.
            return self._model.tokenize(prompt, self._model.add_bos or not prompt, True)
        return [int(t) for t in prompt]

    def _generate(self, prompt_ids: List[int], *, max_tokens: Optional[int], temperature: float,
                  top_p: float, top_k: int, seed: Optional[int], stop: Union[str, List[str], None],
                  press: PressArg, budget: Optional[int], ratio: Optional[float],
                  alloc: Optional[str], ignore_eos: bool) -> Iterator[tuple[str, Dict[str, Any]]]:
        """Yields text pieces, then ("", final info) once."""
        if max_tokens is None or max_tokens < 0:
            max_tokens = max(0, self.n_ctx - len(prompt_ids))
        session = self.session(press, budget, ratio, alloc)
        generation = _core.Generation(
            session._session, prompt_ids, [], int(max_tokens), float(temperature), int(top_k),
            float(top_p), int(seed if seed is not None else 42), bool(ignore_eos))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        matcher = _StopMatcher(stops)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stopped_by_string = False
        while True:
            step = generation.next()
            if step is None:
                break
            text, hit = matcher.push(decoder.decode(step[1]))
            if text:
                yield text, {}
            if hit:
                stopped_by_string = True
                break
        if not stopped_by_string:
            tail, _ = matcher.push(decoder.decode(b"", final=True))
            tail += matcher.flush()
            if tail:
                yield tail, {}
        result = generation.result()
        finish = "stop" if stopped_by_string else _FINISH_REASONS[result["stopped"]]
        completion_tokens = len(result["tokens"])
        yield "", {
            "finish_reason": finish,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
            "kv_compression": {
                "press": session.press,
                "kv_bytes": session.kv_bytes(),
                "kv_bytes_after_prefill": result["prefill"]["kv_bytes"],
            },
            "timings": {
                "prompt_ms": result["prefill"]["prefill_ms"],
                "predicted_ms": result["decode_ms"],
            },
            "tokens": result["tokens"],
        }

    def create_completion(self, prompt: Union[str, Sequence[int]], max_tokens: Optional[int] = 16,
                          temperature: float = 0.8, top_p: float = 0.95, top_k: int = 40,
                          seed: Optional[int] = None, stop: Union[str, List[str], None] = None,
                          stream: bool = False, press: PressArg = None,
                          budget: Optional[int] = None, ratio: Optional[float] = None,
                          alloc: Optional[str] = None, ignore_eos: bool = False
                          ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """An OpenAI text completion of ``prompt`` (text, or token ids). ``max_tokens`` None or
        < 0: until the context is full. ``temperature=0``: greedy. ``press``/``budget``/``ratio``
        /``alloc`` compress the prompt's KV cache (see ``session()``). ``stream=True`` returns a
        generator of chunks. The result also carries ``kv_compression`` (press, KV bytes held)
        and ``timings``."""
        prompt_ids = self._prompt_ids(prompt)
        pieces = self._generate(prompt_ids, max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, seed=seed, stop=stop, press=press,
                                budget=budget, ratio=ratio, alloc=alloc, ignore_eos=ignore_eos)
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion",
                "created": int(time.time()), "model": self.model_path}
        if stream:
            return self._stream(pieces, head, chat=False)
        return self._collect(pieces, head, chat=False)

    __call__ = create_completion

    def create_chat_completion(self, messages: List[Dict[str, str]],
                               max_tokens: Optional[int] = None, temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, seed: Optional[int] = None,
                               stop: Union[str, List[str], None] = None, stream: bool = False,
                               press: PressArg = None, budget: Optional[int] = None,
                               ratio: Optional[float] = None, alloc: Optional[str] = None
                               ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """An OpenAI chat completion: ``messages`` (``{"role", "content"}`` dicts) rendered with
        the model's chat template; the other arguments as ``create_completion``."""
        pairs = []
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise Error("each message needs a role and a content")
            content = m.get("content") or ""
            if not isinstance(content, str):
                raise Error("message content must be a string")
            pairs.append((str(m["role"]), content))
        prompt = self._model.render_chat(pairs, True)
        prompt_ids = self._model.tokenize(prompt, self._model.add_bos, True)
        pieces = self._generate(prompt_ids, max_tokens=max_tokens, temperature=temperature,
                                top_p=top_p, top_k=top_k, seed=seed, stop=stop, press=press,
                                budget=budget, ratio=ratio, alloc=alloc, ignore_eos=False)
        head = {"id": f"chatcmpl-{uuid.uuid4()}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model_path}
        if stream:
            return self._stream(pieces, head, chat=True)
        return self._collect(pieces, head, chat=True)

    @staticmethod
    def _collect(pieces: Iterator[tuple[str, Dict[str, Any]]], head: Dict[str, Any],
                 chat: bool) -> Dict[str, Any]:
        """The whole reply as one completion dict."""
        text, info = "", {}
        for piece, info in pieces:
            text += piece
        choice = {"index": 0, "logprobs": None, "finish_reason": info["finish_reason"]}
        choice.update({"message": {"role": "assistant", "content": text}} if chat
                      else {"text": text})
        return {**head, "choices": [choice], "usage": info["usage"],
                "kv_compression": info["kv_compression"], "timings": info["timings"]}

    @staticmethod
    def _stream(pieces: Iterator[tuple[str, Dict[str, Any]]], head: Dict[str, Any],
                chat: bool) -> Iterator[Dict[str, Any]]:
        head = dict(head, object="chat.completion.chunk" if chat else "text_completion")
        if chat:
            yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                        "logprobs": None, "finish_reason": None}]}
        for piece, info in pieces:
            if info:
                last = {"index": 0, "logprobs": None, "finish_reason": info["finish_reason"]}
                last.update({"delta": {}} if chat else {"text": ""})
                yield {**head, "choices": [last], "usage": info["usage"],
                       "kv_compression": info["kv_compression"], "timings": info["timings"]}
            else:
                choice = {"index": 0, "logprobs": None, "finish_reason": None}
                choice.update({"delta": {"content": piece}} if chat else {"text": piece})
                yield {**head, "choices": [choice]}
