"""Codec spec strings (the ``codec:`` field of scenario files) and :func:`build`.

Grammar (whitespace around parts is ignored)::

    spec     := "ef(" chain ")" | "ef21(" chain ")" | chain
    chain    := dense | sparse [ "+" dense ]       # sparse + dense: values quantized
    dense    := "none" | "fp16" | "bf16" | "int8" [":nearest" | ":stochastic"] [":chunk=N"]
    sparse   := "topk:R" [":exact" | ":approx"] [":tol=F"] | "randk:R"

``R`` is the kept fraction in [1e-6, 1] (:data:`MIN_RATIO`: one element in a million
still keeps 70,000 of a 70B model's gradients, sparser than published top-k schemes
such as DGC's 0.001; below it ``max(1, round(R * d))`` keeps a single element, and a
ratio such as ``1e-300`` is a typo, refused); ``tol`` (approx top-k
only) is the accepted shortfall of kept elements in [0, 1) (default 0.1, see
:mod:`oresearcher.codecs.sparse`); ``N`` the int8 chunk size in elements, 1 to 2**24
(:data:`MAX_CHUNK`, default :data:`oresearcher.comm.wire.INT8_CHUNK`, 2048). Examples: ``int8``, ``int8:stochastic``,
``topk:0.01``, ``topk:0.01+int8``, ``ef(topk:0.01:approx)``, ``ef21(randk:0.05+fp16)``.
Every codec's ``spec`` attribute is the canonical form, and ``build(codec.spec)``
rebuilds an equal codec.

Parsed once: :func:`parse` turns a spec string into a :class:`CodecSpec` (the typed
value the scenario's ``communication.codec`` holds); :meth:`CodecSpec.make` builds an
agent's codec from it, or None where the spec is ``none`` (:attr:`CodecSpec.is_none`,
the one "no compression" test). :func:`build` is ``parse`` then the codec, never None.

Seeds: ``seed`` drives an agent's private randomness (stochastic rounding, the
threshold sample of approx top-k) and should differ between agents;
``shared_seed`` drives randomness every agent must agree on (rand-k indices) and must
be equal on all agents.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..comm.wire import INT8_CHUNK
from .base import Codec
from .feedback import EF21, ErrorFeedback
from .quant import Cast, Identity, Int8
from .sparse import RandK, TopK

_WRAPPERS = {"ef": ErrorFeedback, "ef21": EF21}
_DENSE = ("none", "fp16", "bf16", "int8")
_SPARSE = ("topk", "randk")
MIN_RATIO = 1e-6  # kept fraction of top-k / rand-k: smallest accepted
MAX_CHUNK = 2**24  # int8 chunk, elements: largest accepted
DEFAULT_TOL = 0.1


@dataclass(frozen=True)
class DensePart:
    """``none``, ``fp16``, ``bf16`` or ``int8`` with its rounding and chunk."""

    name: str = "none"
    stochastic: bool = False
    chunk: int = INT8_CHUNK


@dataclass(frozen=True)
class SparsePart:
    """``topk`` or ``randk`` with its kept fraction (and top-k's approx/tol)."""

    name: str
    ratio: float
    approx: bool = False
    tol: float = DEFAULT_TOL


@dataclass(frozen=True)
class CodecSpec:
    """A parsed codec spec: ``text`` as written, the optional error-feedback wrapper
    (``""``, ``"ef"`` or ``"ef21"``), the optional sparsifier and the value codec."""

    text: str
    dense: DensePart = DensePart()
    sparse: Optional[SparsePart] = None
    feedback: str = ""

    @property
    def is_none(self) -> bool:
        """No compression: the plain exchange (the one place "none" is decided)."""
        return not self.feedback and self.sparse is None and self.dense.name == "none"

    def make(self, *, seed: int = 0, shared_seed: int = 0) -> Optional[Codec]:
        """An agent's codec (seeds as in the module docstring); None for ``none``."""
        return None if self.is_none else self.codec(seed=seed, shared_seed=shared_seed)

    def codec(self, *, seed: int = 0, shared_seed: int = 0) -> Codec:
        """The codec object, ``none`` included (an Identity)."""
        seed, shared_seed = int(seed), int(shared_seed)
        values = _dense(self.dense, seed)
        if self.sparse is not None:
            sp = self.sparse
            values = (RandK(sp.ratio, values=values, shared_seed=shared_seed) if sp.name == "randk" else
                      TopK(sp.ratio, approx=sp.approx, tol=sp.tol, values=values, seed=seed))
        return _WRAPPERS[self.feedback](values) if self.feedback else values

    def __str__(self) -> str:
        return self.text


NO_CODEC = CodecSpec("none")


def _dense(d: DensePart, seed: int) -> Codec:
    if d.name == "int8":
        return Int8(stochastic=d.stochastic, chunk=d.chunk, seed=seed)
    return {"none": Identity, "fp16": lambda: Cast(torch.float16), "bf16": lambda: Cast(torch.bfloat16)}[d.name]()


def parse(spec) -> CodecSpec:
    """The typed value of ``spec`` (a string or a CodecSpec); ValueError naming the bad part."""
    if isinstance(spec, CodecSpec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"codec spec must be a string, got {type(spec).__name__}")
    feedback, sparse, dense = _Parser(spec).spec(spec.strip())
    return CodecSpec(spec, dense, sparse, feedback)


def build(spec, *, seed: int = 0, shared_seed: int = 0) -> Codec:
    """The codec described by ``spec``; ValueError naming the bad part otherwise."""
    return parse(spec).codec(seed=seed, shared_seed=shared_seed)


class _Parser:
    def __init__(self, full: str):
        self.full = full

    def fail(self, part: str, why: str):
        raise ValueError(f"bad codec spec {self.full!r}: {part!r} {why}")

    def spec(self, s: str) -> tuple:
        for name in _WRAPPERS:
            if s.startswith(name + "("):
                if not s.endswith(")"):
                    self.fail(s, "is missing its closing ')'")
                inner = s[len(name) + 1:-1].strip()
                if inner.split("(")[0].strip() in _WRAPPERS:
                    self.fail(s, "nests error feedback; wrap a plain codec")
                return (name, *self.chain(inner))
        if "(" in s or ")" in s:
            self.fail(s, "has parentheses; only ef(...) and ef21(...) wrap codecs")
        return ("", *self.chain(s))

    def chain(self, s: str) -> tuple:
        """(sparse part or None, dense part)."""
        if not s:
            self.fail(s, "is empty; expected a codec such as int8 or topk:0.01")
        parts = [p.strip() for p in s.split("+")]
        if len(parts) > 2:
            self.fail(s, "chains more than two codecs; use sparse+dense, e.g. topk:0.01+int8")
        if len(parts) == 1:
            name = parts[0].split(":")[0].strip()
            return (self.sparse(parts[0]), DensePart()) if name in _SPARSE else (None, self.dense(parts[0]))
        left, right = parts
        if left.split(":")[0].strip() not in _SPARSE:
            self.fail(left, "is not a sparsifier (topk, randk); '+' quantizes a sparsifier's values")
        if right.split(":")[0].strip() not in _DENSE:
            self.fail(right, f"is not a value codec; expected one of {', '.join(_DENSE)}")
        values = self.dense(right)  # the value codec's mistakes are named first
        return self.sparse(left), values

    def dense(self, s: str) -> DensePart:
        name, *args = [a.strip() for a in s.split(":")]
        if name not in _DENSE:
            self.fail(name, f"is not a codec; expected one of {', '.join(_DENSE + _SPARSE)}")
        if name in ("none", "fp16", "bf16"):
            if args:
                self.fail(s, f"takes no arguments ({name})")
            return DensePart(name)
        stochastic, chunk = False, INT8_CHUNK
        for a in args:
            if a in ("nearest", "stochastic"):
                stochastic = a == "stochastic"
            elif a.startswith("chunk="):
                chunk = self.integer(a, a[6:], lo=1, hi=MAX_CHUNK)
            else:
                self.fail(a, "is not an int8 option; expected nearest, stochastic or chunk=N")
        return DensePart("int8", stochastic, chunk)

    def sparse(self, s: str) -> SparsePart:
        name, *args = [a.strip() for a in s.split(":")]
        if not args:
            self.fail(s, f"needs a ratio, e.g. {name}:0.01")
        ratio = self.number(args[0], args[0], lo=MIN_RATIO, hi=1.0)
        if name == "randk":
            if len(args) > 1:
                self.fail(args[1], "is not a randk option (randk takes only a ratio)")
            return SparsePart(name, ratio)
        approx, tol = False, DEFAULT_TOL
        for a in args[1:]:
            if a in ("exact", "approx"):
                approx = a == "approx"
            elif a.startswith("tol="):
                tol = self.number(a, a[4:], lo=0.0, hi=1.0, hi_open=True)
            else:
                self.fail(a, "is not a topk option; expected exact, approx or tol=F")
        if tol != DEFAULT_TOL and not approx:
            self.fail(s, "sets tol for exact top-k; tol applies to topk:R:approx")
        return SparsePart(name, ratio, approx, tol)

    def number(self, part, text, lo, hi, lo_open=False, hi_open=False) -> float:
        try:
            v = float(text)
        except ValueError:
            self.fail(part, "is not a number")
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            self.fail(part, f"is out of range {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}")
        return v

    def integer(self, part, text, lo, hi) -> int:
        try:
            v = int(text)
        except ValueError:
            self.fail(part, "is not an integer")
        if not lo <= v <= hi:
            self.fail(part, f"is out of range [{lo}, {hi}]")
        return v
