"""Seeds derived from the scenario's ``seed``: one helper, every stream named at its call site.

Each random stream (an agent's codec, its batches, its privacy noise, a round's fusion
draws, ...) needs its own seed, different between agents and between streams, and the
same on every run of one scenario. They are all made by :func:`derive`: the parent seed
times a prime, plus the salt (a rank, a round, a constant naming the stream), repeated
for a chain of salts:

    derive(seed, rank)                              seed * 1009 + rank
    derive(seed, rank, prime=1000)                  seed * 1000 + rank   (batch order)
    derive(seed, rank, 3, prime=(7919, 104729))     (seed * 7919 + rank) * 104729 + 3

The primes are those the project has always used, so every seeded result (the README's
figures, the golden tests) is unchanged: a different prime would move them all. The
result is taken modulo 2**63 (what ``torch.Generator.manual_seed`` accepts); for scenario
seeds (at most 2**32 - 1, :data:`oresearcher.scenario.types.MAX_SEED`) and the salts in
use the chains stay below that, so the modulo changes nothing there.

numpy streams in the simulator (``sim/engine.py``, ``sim/faults.py``) seed
``np.random.default_rng`` with a list (``[seed, rank]``), numpy's own way of deriving
independent streams; they do not go through here.
"""
from __future__ import annotations

import zlib
from typing import Sequence, Union

RANK = 1009  # per agent: seed * 1009 + rank (codecs, distillation, model init by architecture)
STREAM = 1_000_003  # a stream far from the per-rank ones (token streams, fusion rounds)
SMALL = 7_919  # the 1000th prime: ensemble fits, cooperative draws, privacy
LARGE = 104_729  # the 10000th prime: privacy noise


def derive(seed: int, *salts: int, prime: Union[int, Sequence[int]] = RANK) -> int:
    """``seed``, then for each salt ``s`` (with its prime ``p``): ``x = x * p + s``; mod 2**63.
    ``prime`` is one prime for every step or one per salt."""
    primes = (prime,) * len(salts) if isinstance(prime, int) else tuple(prime)
    if len(primes) != len(salts):
        raise ValueError(f"{len(salts)} salts for {len(primes)} primes")
    x = int(seed)
    for s, p in zip(salts, primes):
        x = x * int(p) + int(s)
    return x % 2**63


def name_salt(name: str) -> int:
    """A salt from a name (an architecture): CRC-32 mod 1000, stable across runs and hosts
    (Python's ``hash`` of a string is not)."""
    return zlib.crc32(name.encode()) % 1000
