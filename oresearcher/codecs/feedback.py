"""Error feedback: ``ef(...)`` (classic) and ``ef21(...)``, wrapping any codec.

``ef(C)`` (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, "Error Feedback
Fixes SignSGD"): per key, the residual ``e`` (what compression dropped so far) is added
to the next input before compressing::

    v = x + e;   send C(v);   e <- v - decode(C(v))

so ``sum_t decode_t + e_T = sum_t x_t`` (no gradient mass is lost, up to the rounding
of the two additions in the compute dtype). For a contractive ``C``
(``||v - C(v)||^2 <= (1-delta)||v||^2``, e.g. top-k with ``delta = k/d``) the residual
stays bounded: ``||e|| <= q/(1-q) * max_t ||x_t||`` with ``q = sqrt(1-delta)``.
Decoding is the inner codec's (the receiver needs no state).

``ef21(C)`` (Richtarik et al. 2021, "EF21: A New, Simpler, Theoretically Better, and
Practically Faster Error Feedback"): each sender keeps an estimate ``h`` of its input
and sends only the compressed change::

    send C(x - h);   h <- h + decode(C(x - h))

so ``decode(payload)`` is the *increment*. Receivers keep the running sum ``g`` of all
senders' estimates: :meth:`EF21.aggregate` adds the summed increments of one round to
``g`` (per key) and returns it. For a contractive ``C``,
``||x - h_new||^2 <= (1-delta) ||x - h_old||^2``: a constant input is tracked
geometrically fast.

State is per key (see :mod:`oresearcher.codecs.base`) and is saved by ``state_dict``
(tensors and ints only: ``torch.load(..., weights_only=True)`` reads it back), so it
survives a checkpoint. Shape-mode (meta) encodes touch no state. A non-finite input raises
ValueError and leaves the state as it was; a finite input whose sum with the residual
overflows raises ValueError too and resets that key's residual.
"""
from __future__ import annotations

import torch

from . import fused
from .base import DEFAULT_KEY, Codec, KeyedTensors, check_finite
from .quant import Int8


class _Wrapper(Codec):
    def __init__(self, inner: Codec, name: str):
        if isinstance(inner, _Wrapper):
            raise ValueError(f"{name}(...) cannot wrap another feedback codec ({inner.spec})")
        self.inner = inner
        self.spec = f"{name}({inner.spec})"

    def layout(self, numel, dtype=torch.float32):
        return self.inner.layout(numel, dtype)

    def _decode(self, tensors, numel, dtype):
        return self.inner._decode(tensors, numel, dtype)

    def _roundtrip(self, v, dtype, key):
        tensors = self.inner._encode(v, dtype, key)
        return tensors, self.inner._decode(tensors, v.numel(), dtype)


class ErrorFeedback(_Wrapper):
    """``ef(C)``: classic error feedback, one residual per key."""

    def __init__(self, inner: Codec):
        super().__init__(inner, "ef")
        self.residual = KeyedTensors("ef residual")

    def _encode(self, flat, dtype, key):
        e = self.residual.get(key, flat.numel(), flat)
        if isinstance(self.inner, Int8) and fused.applies(flat):
            out = self._fused_int8(flat, e, key)
            if out is not None:
                return out
        if e is None:
            tensors, sent = self._roundtrip(flat, dtype, key)  # raises on non-finite input
            self.residual.items[key] = flat - sent
            return tensors
        check_finite(flat)  # before e is updated in place
        v = e.add_(flat)  # v = x + e, in the residual's own storage (no full-size allocation)
        try:
            tensors, sent = self._roundtrip(v, dtype, key)
        except ValueError:  # x + e overflowed: that residual is lost, say so
            del self.residual.items[key]
            raise ValueError(f"ef: input plus residual overflows for key {key!r}; its residual was reset") from None
        self.residual.items[key] = v.sub_(sent)  # e <- v - decode(C(v)); payloads never alias v
        return tensors

    def _fused_int8(self, flat, e, key):
        """``ef(int8...)`` in one Triton pass (:mod:`.fused`): the residual is read, and
        the new one written to a fresh buffer, by the same kernel as the codes."""
        gen = self.inner.rng.generator(flat.device) if self.inner.stochastic else None
        try:
            out = fused.int8_quantize(flat, self.inner.chunk, gen, residual=e, ef=True)
        except OverflowError:
            del self.residual.items[key]
            raise ValueError(f"ef: input plus residual overflows for key {key!r}; its residual was reset") from None
        if out is None:
            return None
        absmax, codes, self.residual.items[key] = out
        return {"absmax": absmax, "codes": codes}

    def state_dict(self):
        return {"residual": self.residual.state_dict(), "inner": self.inner.state_dict()}

    def load_state_dict(self, state):
        self.residual.load_state_dict(state["residual"])
        self.inner.load_state_dict(state["inner"])


class EF21(_Wrapper):
    """``ef21(C)``: senders send compressed changes of their estimate ``h``; receivers
    accumulate the summed changes in ``g`` through :meth:`aggregate`."""

    def __init__(self, inner: Codec):
        super().__init__(inner, "ef21")
        self.estimate = KeyedTensors("ef21 sender estimate")
        self.received = KeyedTensors("ef21 receiver estimate")

    def _encode(self, flat, dtype, key):
        h = self.estimate.get(key, flat.numel(), flat)
        diff = flat if h is None else flat - h
        tensors, step = self._roundtrip(diff, dtype, key)  # raises on non-finite input
        self.estimate.items[key] = step.clone() if h is None else h.add_(step)
        return tensors

    def aggregate(self, total: torch.Tensor, key: str = DEFAULT_KEY) -> torch.Tensor:
        """``g[key] += total``; returns a copy of ``g[key]`` (the estimate of the sum)."""
        if total.device.type == "meta":
            return total
        g = self.received.get(key, total.numel(), total)
        g = total.clone() if g is None else g.reshape(total.shape) + total
        self.received.items[key] = g
        return g.clone()

    def sender_estimate(self, key: str = DEFAULT_KEY):
        """This agent's current ``h`` for ``key`` (flat, compute dtype), or None."""
        return self.estimate.items.get(key)

    def state_dict(self):
        return {"estimate": self.estimate.state_dict(), "received": self.received.state_dict(),
                "inner": self.inner.state_dict()}

    def load_state_dict(self, state):
        self.estimate.load_state_dict(state["estimate"])
        self.received.load_state_dict(state["received"])
        self.inner.load_state_dict(state["inner"])
