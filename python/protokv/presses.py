# SPDX-License-Identifier: Apache-2.0
"""KV-cache presses as objects, one class per press of the C++ press table.

``protokv.presses.SnapKV(window=16)`` names the press ``snapkv`` with ``window=16``; the options
and their defaults are read from the engine itself (``protokv help-presses`` documents them), so
every press the library registers is here, and an unknown option raises ``protokv.Error`` when
the object is made, not when it is used.
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from . import _core

__all__ = ["Press", "ScorerPress", "list_presses", "press_help", "press_options"]

# Python class names of the registered presses (the papers' spelling); a press added to the C++
# table later gets a title-cased name until it is listed here.
_CLASS_NAMES = {
    "full": "Full",
    "streaming_llm": "StreamingLLM",
    "h2o": "H2O",
    "snapkv": "SnapKV",
    "pyramidkv": "PyramidKV",
    "adakv": "AdaKV",
    "knorm": "Knorm",
    "expected_attention": "ExpectedAttention",
    "protokv": "ProtoKV",
    "clusterkv": "ClusterKV",
    "chelsea": "Chelsea",
    "pod": "PoD",
}


def list_presses() -> List[str]:
    """Names of every press the engine registers, in display order."""
    return list(_core.press_names())


def press_help() -> str:
    """Every press's help paragraph: what it keeps, its options and defaults."""
    return _core.press_help()


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


class Press:
    """A press: a name and its options, checked by the engine when made.

    ``Press("snapkv", window=16)`` equals ``SnapKV(window=16)``. ``alloc`` names a budget
    allocator (``uniform``, ``adakv``, ``pyramid``, ...; see ``protokv help-presses``).
    """

    name: str = ""

    def __init__(self, name: str | None = None, *, alloc: str = "", **options: Any) -> None:
        if name is not None:
            self.name = name
        if not self.name:
            raise TypeError("Press needs a name")
        self.options: Dict[str, Any] = dict(options)
        self.alloc = alloc
        # Validates now: an unknown press or option raises protokv.Error here.
        self._config = _core.press_config(self.spec, alloc)

    @property
    def spec(self) -> str:
        """The engine's press spec, NAME[:key=value,...]."""
        if not self.options:
            return self.name
        return self.name + ":" + ",".join(
            f"{k}={_format_value(v)}" for k, v in self.options.items()
        )

    def config(self) -> Dict[str, Any]:
        """Every option with its value, defaults filled in, as the engine resolved them."""
        return dict(self._config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        if self.alloc:
            args = (args + ", " if args else "") + f"alloc={self.alloc!r}"
        return f"{type(self).__name__}({args})"


class ScorerPress:
    """A press written in Python: subclass it and define ``score()``.

    At prefill, after each layer's attention, the engine calls ``score(keys, values,
    window_queries, positions)`` with that layer's uncompressed cache (kvpress's ``score()``
    contract, one sequence):

    - ``keys``, ``values``: ``float32[n_kv_heads, n, head_dim]`` (keys after RoPE);
    - ``window_queries``: ``float32[n_heads, w, head_dim]``, the queries of the last
      ``w = max(window, 1)`` prompt tokens (query head ``h`` reads KV head
      ``h // (n_heads // n_kv_heads)``);
    - ``positions``: ``int32[n]``, the tokens' positions;
    - ``self.layer``: the layer being compressed.

    It returns one score per prompt token per KV head, ``[n_kv_heads, n]`` (or
    ``[n_kv_heads, n - window]``), higher = keep. The engine keeps the last ``window`` tokens
    and, of the others, the best by score with the same allocator and selector as its own
    scoring presses (ties: the lower position), so the memory is really freed. ``alloc``
    (``uniform``, ``pyramid``, ``adakv``) and its options (``beta=``, ``floor=``) spread the
    budget over layers and heads. Arguments are copies: keeping them is safe.
    """

    window: int = 0

    def __init__(self, *, window: int | None = None, alloc: str = "",
                 **alloc_options: Any) -> None:
        if window is not None:
            self.window = int(window)
        self.alloc = alloc
        self.alloc_options = dict(alloc_options)
        self.layer = 0
        self._handle()  # checks the window and the allocator now

    @property
    def name(self) -> str:
        """The press's name in run labels and configs: its class name."""
        return type(self).__name__

    def score(self, keys: np.ndarray, values: np.ndarray, window_queries: np.ndarray,
              positions: np.ndarray) -> np.ndarray:
        """One score per token per KV head, ``[n_kv_heads, n]`` (higher = keep): define it."""
        raise NotImplementedError(f"{self.name} must define score()")

    def _score_layer(self, layer: int, keys: np.ndarray, values: np.ndarray,
                     window_queries: np.ndarray, positions: np.ndarray) -> np.ndarray:
        self.layer = layer
        scores = np.asarray(self.score(keys, values, window_queries, positions),
                            dtype=np.float32)
        n = keys.shape[1]
        n_prefix = n - self.window
        if scores.ndim != 2 or scores.shape[0] != keys.shape[0] or \
                scores.shape[1] not in (n, n_prefix):
            raise ValueError(
                f"{self.name}.score() must return [n_kv_heads, n] = [{keys.shape[0]}, {n}] "
                f"scores, got shape {scores.shape}")
        return np.ascontiguousarray(scores[:, :n_prefix])

    def _handle(self) -> "_core.PressHandle":
        # Made per session and owned by it (it holds this object), so that the press object
        # does not hold itself through the engine.
        options = ",".join(f"{k}={_format_value(v)}" for k, v in self.alloc_options.items())
        return _core.python_press(self._score_layer, self.name, self.window, self.alloc,
                                  options)

    def __repr__(self) -> str:
        return f"{self.name}(window={self.window})"


def press_options(name: str) -> List[Dict[str, str]]:
    """The options of press ``name`` from the engine's schema: ``key``, ``default``, ``values``
    (range or choices), ``help`` and ``reference`` (paper and equation), one dict each."""
    return [dict(row) for row in _core.press_options(name)]


def _make_class(name: str) -> type:
    class_name = _CLASS_NAMES.get(name, name.title().replace("_", ""))
    options = press_options(name)
    lines = [f"The ``{name}`` press.", ""]
    if options:
        lines += ["Keyword options (the engine's schema; ``alloc=`` names a budget allocator):", ""]
        for row in options:
            source = f" [{row['reference']}]" if row["reference"] else ""
            lines.append(f"- ``{row['key']}`` = {row['default']} ({row['values']}): "
                         f"{row['help']}{source}")
    else:
        lines.append("No options.")
    attributes = {"name": name, "__doc__": "\n".join(lines), "__module__": __name__,
                  "OPTIONS": tuple(row["key"] for row in options)}
    return type(class_name, (Press,), attributes)


for _name in list_presses():
    _cls = _make_class(_name)
    globals()[_cls.__name__] = _cls
    __all__.append(_cls.__name__)
del _name, _cls
