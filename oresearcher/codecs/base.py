"""The codec interface, payloads and their wire format.

Vocabulary (defined here, once):

- *codec*: turns one agent's tensor into a :class:`Payload` (``encode``) and a payload
  back into a tensor (``decode``). A codec object belongs to one agent; it may hold
  state (error-feedback residuals, a random generator) but never a process group.
- *payload*: what travels on the wire for one tensor: ``tensors`` (a dict of flat
  tensors, in the order of the codec's :meth:`Codec.layout`) plus small local metadata
  (shape, dtype, device, key) that the receiver knows already and that does not travel.
- *wire bytes*: ``payload.nbytes``, the sum of ``numel * element_size`` of the payload
  tensors. Every codec here has a payload size fixed by ``(numel, dtype)``, so
  ``codec.wire_bytes(numel, dtype)`` gives it exactly without touching data.
- *key*: names a stream of tensors (one gradient bucket, one parameter group). Stateful
  codecs keep their state per key, so ``encode(x, key="bucket3")`` and
  ``encode(y, key="bucket4")`` have separate error-feedback residuals. The default key
  is ``"default"``. A key must keep the same number of elements for its whole life.
- *compute dtype*: float64 for float64 inputs, float32 for every other input dtype;
  codec math and decoded values use it, and ``decode`` casts back to the input dtype.

Shape mode: ``encode`` on a meta tensor returns a payload of meta tensors with exactly
the wire sizes of a real encode (from the layout), and touches no state; ``decode`` of
a meta payload returns a meta tensor of the input's shape and dtype. So a simulated
program can yield compressed collectives of the right byte size at no cost.

Packing: collectives move one flat uint8 tensor per payload (:func:`pack`); the
receiver rebuilds the payload from the codec's layout (:func:`unpack`). ``pack`` can pad
to a common size for collectives that need equal shapes; padding bytes travel and count
as wire bytes of that collective (no codec here needs padding: sizes are fixed by
``(numel, dtype)``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

DEFAULT_KEY = "default"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Field:
    """One wire tensor of a payload: its name, dtype and number of elements."""

    name: str
    dtype: torch.dtype
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(eq=False)
class Payload:
    """What one agent puts on the wire for one tensor.

    ``tensors`` is the wire part (flat tensors, in layout order); ``shape``, ``dtype``,
    ``device`` and ``key`` are local metadata the receiver already knows.
    """

    tensors: dict
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    key: str = DEFAULT_KEY

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Exact bytes on the wire (the padding added by :func:`pack` is not included)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def is_meta(self) -> bool:
        return self.device.type == "meta"


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 otherwise (half types are widened)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def index_dtype(numel: int) -> torch.dtype:
    """Narrowest index type for positions in a tensor of ``numel`` elements."""
    return torch.int32 if numel <= 2**31 - 1 else torch.int64


def check_finite(flat: torch.Tensor, what: str = "codec input") -> None:
    """Raise ValueError if ``flat`` holds a NaN or an infinity.

    amax and amin propagate NaN and catch +inf and -inf; both are vectorised
    read-only reductions, several times cheaper than ``isfinite(x).all()`` on CPU.
    """
    if flat.numel() == 0:
        return
    hi, lo = flat.amax(), flat.amin()
    if not (torch.isfinite(hi) and torch.isfinite(lo)):
        raise ValueError(f"{what} holds non-finite values (NaN or inf)")


def prefixed(fields, prefix: str) -> tuple:
    """The fields of a nested codec, renamed ``prefix + name``."""
    return tuple(Field(prefix + f.name, f.dtype, f.numel) for f in fields)


def sub_tensors(tensors: dict, prefix: str) -> dict:
    """The tensors of a nested codec's payload, with ``prefix`` stripped."""
    n = len(prefix)
    return {k[n:]: t for k, t in tensors.items() if k.startswith(prefix)}


class Codec:
    """Base class. Subclasses implement ``layout``, ``_encode`` and ``_decode``.

    ``_encode(flat, dtype, key)`` gets the input flattened and converted to
    ``compute_dtype(dtype)`` and returns the wire tensors in layout order; it must
    check finiteness itself (raising ValueError before touching any state).
    ``_decode(tensors, numel, dtype)`` returns a flat tensor in the compute dtype.
    """

    spec: str = "?"

    def layout(self, numel: int, dtype: torch.dtype = torch.float32) -> tuple:
        raise NotImplementedError

    def wire_bytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        """Exact wire bytes of a payload for ``numel`` elements of ``dtype``; no data touched."""
        return sum(f.nbytes for f in self.layout(int(numel), dtype))

    def encode(self, x: torch.Tensor, key: str = DEFAULT_KEY) -> Payload:
        _check_input(x)
        if x.device.type == "meta":
            return meta_payload(self, x.shape, x.dtype, key)
        flat = x.detach().reshape(-1).to(compute_dtype(x.dtype))
        tensors = self._encode(flat, x.dtype, key)
        return Payload(tensors, x.shape, x.dtype, x.device, key)

    def decode(self, p: Payload) -> torch.Tensor:
        if p.is_meta:
            return torch.empty(p.shape, dtype=p.dtype, device="meta")
        flat = self._decode(p.tensors, p.numel, p.dtype)
        return flat.to(p.dtype).reshape(p.shape)

    def aggregate(self, total: torch.Tensor, key: str = DEFAULT_KEY) -> torch.Tensor:
        """Turn the sum of all senders' decoded payloads into the estimate of the sum
        of their inputs. The identity, except for EF21 (which keeps a running estimate)."""
        return total

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"{self.spec}: stateless codec got state keys {sorted(state)}")

    def _encode(self, flat: torch.Tensor, dtype: torch.dtype, key: str) -> dict:
        raise NotImplementedError

    def _decode(self, tensors: dict, numel: int, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


def _check_input(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"codecs encode tensors, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"codecs encode floating tensors {FLOAT_DTYPES}, got {x.dtype}")


def meta_payload(codec: Codec, shape, dtype, key: str = DEFAULT_KEY) -> Payload:
    """The payload a real encode would produce, as meta tensors (shape mode)."""
    numel = math.prod(shape)
    tensors = {f.name: torch.empty(f.numel, dtype=f.dtype, device="meta") for f in codec.layout(numel, dtype)}
    return Payload(tensors, torch.Size(shape), dtype, torch.device("meta"), key)


def pack(p: Payload, size: Optional[int] = None) -> torch.Tensor:
    """The payload as one flat uint8 tensor, zero-padded to ``size`` bytes if given.

    Byte order is the machine's (all ranks of a job share it).
    """
    n = p.nbytes
    size = n if size is None else int(size)
    if size < n:
        raise ValueError(f"pack: payload has {n} bytes, more than size={size}")
    if p.is_meta:
        return torch.empty(size, dtype=torch.uint8, device="meta")
    parts = [t.contiguous().reshape(-1).view(torch.uint8) for t in p.tensors.values()]
    if size > n:
        parts.append(torch.zeros(size - n, dtype=torch.uint8, device=p.device))
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=p.device)
    return torch.cat(parts)


def unpack(buf: torch.Tensor, codec: Codec, shape, dtype: torch.dtype, key: str = DEFAULT_KEY) -> Payload:
    """Rebuild a payload from :func:`pack`'s bytes; trailing padding is ignored.

    The receiver supplies what it knows locally: the codec, the shape and dtype of the
    encoded tensor (equal on every rank of a collective) and the key.
    """
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise ValueError(f"unpack: expected a flat uint8 tensor, got {buf.dtype} of shape {tuple(buf.shape)}")
    shape = torch.Size(shape)
    fields = codec.layout(math.prod(shape), dtype)
    need = sum(f.nbytes for f in fields)
    if buf.numel() < need:
        raise ValueError(f"unpack: {codec.spec} needs {need} bytes for shape {tuple(shape)}, got {buf.numel()}")
    tensors, off = {}, 0
    for f in fields:
        if buf.device.type == "meta":
            t = torch.empty(f.numel, dtype=f.dtype, device="meta")
        else:
            raw = buf[off:off + f.nbytes]
            if (raw.storage_offset() * raw.element_size()) % f.dtype.itemsize:
                raw = raw.clone()  # misaligned for a typed view
            t = raw.view(f.dtype)
        tensors[f.name] = t
        off += f.nbytes
    return Payload(tensors, shape, dtype, buf.device, key)


class RngState:
    """Private randomness of one codec: one ``torch.Generator`` per device, each
    seeded with ``seed``. Draws happen in call order, so the same seed and the same
    sequence of calls give the same bytes."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._gens: dict = {}

    def generator(self, device: torch.device) -> torch.Generator:
        name = str(torch.device(device))
        g = self._gens.get(name)
        if g is None:
            g = torch.Generator(device=name).manual_seed(self.seed)
            self._gens[name] = g
        return g

    def state_dict(self) -> dict:
        return {"seed": self.seed, "devices": {d: g.get_state() for d, g in self._gens.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self._gens = {}
        for d, s in state["devices"].items():
            self.generator(d).set_state(s.to("cpu", torch.uint8))


class KeyedTensors:
    """Per-key tensors (error-feedback residuals, EF21 estimates)."""

    def __init__(self, what: str):
        self.what, self.items = what, {}

    def get(self, key: str, numel: int, like: torch.Tensor) -> Optional[torch.Tensor]:
        t = self.items.get(key)
        if t is not None and t.numel() != numel:
            raise ValueError(f"{self.what} for key {key!r} has {t.numel()} elements, input has {numel}; "
                             "use a separate key per tensor")
        return None if t is None else t.to(device=like.device, dtype=like.dtype)

    def state_dict(self) -> dict:
        return {k: t.clone() for k, t in self.items.items()}

    def load_state_dict(self, state: dict) -> None:
        self.items = {str(k): t.clone() for k, t in state.items()}
