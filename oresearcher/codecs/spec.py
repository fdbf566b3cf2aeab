"""Codec spec strings (the ``codec:`` field of scenario files) and :func:`build`.

Grammar (whitespace around parts is ignored)::

    spec     := "ef(" chain ")" | "ef21(" chain ")" | chain
    chain    := dense | sparse [ "+" dense ]       # sparse + dense: values quantized
    dense    := "none" | "fp16" | "bf16" | "int8" [":nearest" | ":stochastic"] [":chunk=N"]
    sparse   := "topk:R" [":exact" | ":approx"] [":tol=F"] | "randk:R"

``R`` is the kept fraction in (0, 1]; ``tol`` (approx top-k only) is the accepted
shortfall of kept elements (default 0.1, see :mod:`oresearcher.codecs.sparse`); ``N``
the int8 chunk size in elements (default 2048). Examples: ``int8``,
``int8:stochastic``, ``topk:0.01``, ``topk:0.01+int8``, ``ef(topk:0.01:approx)``,
``ef21(randk:0.05+fp16)``. Every codec's ``spec`` attribute is the canonical form,
and ``build(codec.spec)`` rebuilds an equal codec.

Seeds: ``seed`` drives an agent's private randomness (stochastic rounding, the
threshold sample of approx top-k) and should differ between agents;
``shared_seed`` drives randomness every agent must agree on (rand-k indices) and must
be equal on all agents.
"""
from __future__ import annotations

import torch

from .base import Codec
from .feedback import EF21, ErrorFeedback
from .quant import Cast, Identity, Int8
from .sparse import RandK, TopK

_WRAPPERS = {"ef": ErrorFeedback, "ef21": EF21}
_DENSE = ("none", "fp16", "bf16", "int8")
_SPARSE = ("topk", "randk")


def build(spec: str, *, seed: int = 0, shared_seed: int = 0) -> Codec:
    """The codec described by ``spec``; ValueError naming the bad part otherwise."""
    if not isinstance(spec, str):
        raise ValueError(f"codec spec must be a string, got {type(spec).__name__}")
    return _Parser(spec, seed, shared_seed).spec(spec.strip())


class _Parser:
    def __init__(self, full: str, seed: int, shared_seed: int):
        self.full, self.seed, self.shared_seed = full, int(seed), int(shared_seed)

    def fail(self, part: str, why: str):
        raise ValueError(f"bad codec spec {self.full!r}: {part!r} {why}")

    def spec(self, s: str) -> Codec:
        for name, cls in _WRAPPERS.items():
            if s.startswith(name + "("):
                if not s.endswith(")"):
                    self.fail(s, "is missing its closing ')'")
                inner = s[len(name) + 1:-1].strip()
                if inner.split("(")[0].strip() in _WRAPPERS:
                    self.fail(s, "nests error feedback; wrap a plain codec")
                return cls(self.chain(inner))
        if "(" in s or ")" in s:
            self.fail(s, "has parentheses; only ef(...) and ef21(...) wrap codecs")
        return self.chain(s)

    def chain(self, s: str) -> Codec:
        if not s:
            self.fail(s, "is empty; expected a codec such as int8 or topk:0.01")
        parts = [p.strip() for p in s.split("+")]
        if len(parts) > 2:
            self.fail(s, "chains more than two codecs; use sparse+dense, e.g. topk:0.01+int8")
        if len(parts) == 1:
            name = parts[0].split(":")[0].strip()
            return self.sparse(parts[0]) if name in _SPARSE else self.dense(parts[0])
        left, right = parts
        if left.split(":")[0].strip() not in _SPARSE:
            self.fail(left, "is not a sparsifier (topk, randk); '+' quantizes a sparsifier's values")
        if right.split(":")[0].strip() not in _DENSE:
            self.fail(right, f"is not a value codec; expected one of {', '.join(_DENSE)}")
        return self.sparse(left, values=self.dense(right))

    def dense(self, s: str) -> Codec:
        name, *args = [a.strip() for a in s.split(":")]
        if name not in _DENSE:
            self.fail(name, f"is not a codec; expected one of {', '.join(_DENSE + _SPARSE)}")
        if name in ("none", "fp16", "bf16"):
            if args:
                self.fail(s, f"takes no arguments ({name})")
            return {"none": Identity, "fp16": lambda: Cast(torch.float16),
                    "bf16": lambda: Cast(torch.bfloat16)}[name]()
        stochastic, chunk = False, 2048
        for a in args:
            if a in ("nearest", "stochastic"):
                stochastic = a == "stochastic"
            elif a.startswith("chunk="):
                chunk = self.integer(a, a[6:], lo=1)
            else:
                self.fail(a, "is not an int8 option; expected nearest, stochastic or chunk=N")
        return Int8(stochastic=stochastic, chunk=chunk, seed=self.seed)

    def sparse(self, s: str, values: Codec = None) -> Codec:
        name, *args = [a.strip() for a in s.split(":")]
        if not args:
            self.fail(s, f"needs a ratio, e.g. {name}:0.01")
        ratio = self.number(args[0], args[0], lo=0.0, hi=1.0, lo_open=True)
        if name == "randk":
            if len(args) > 1:
                self.fail(args[1], "is not a randk option (randk takes only a ratio)")
            return RandK(ratio, values=values, shared_seed=self.shared_seed)
        approx, tol = False, 0.1
        for a in args[1:]:
            if a in ("exact", "approx"):
                approx = a == "approx"
            elif a.startswith("tol="):
                tol = self.number(a, a[4:], lo=0.0, hi=1.0, hi_open=True)
            else:
                self.fail(a, "is not a topk option; expected exact, approx or tol=F")
        if tol != 0.1 and not approx:
            self.fail(s, "sets tol for exact top-k; tol applies to topk:R:approx")
        return TopK(ratio, approx=approx, tol=tol, values=values, seed=self.seed)

    def number(self, part, text, lo, hi, lo_open=False, hi_open=False) -> float:
        try:
            v = float(text)
        except ValueError:
            self.fail(part, "is not a number")
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            self.fail(part, f"is out of range {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}")
        return v

    def integer(self, part, text, lo) -> int:
        try:
            v = int(text)
        except ValueError:
            self.fail(part, "is not an integer")
        if v < lo:
            self.fail(part, f"must be >= {lo}")
        return v
