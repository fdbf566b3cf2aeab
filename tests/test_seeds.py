"""One seed helper reproduces every formula it replaced, number for number (so every
seeded result, the README's figures included, is unchanged)."""
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oresearcher.scenario.types import MAX_SEED, MAX_WORLD
from oresearcher.seeds import LARGE, RANK, SMALL, STREAM, derive, name_salt

seeds = st.integers(0, MAX_SEED)
ranks = st.integers(0, MAX_WORLD)


@given(seeds, ranks, st.integers(0, 10**6), st.text(max_size=20))
def test_derive_is_the_old_formulas(seed, rank, rnd, arch):
    assert derive(seed, rank) == seed * 1009 + rank  # codecs, distillation students
    assert derive(seed, rank, prime=1000) == seed * 1000 + rank  # batch order (digits, finance, cartpole)
    assert derive(seed, name_salt(arch)) == seed * 1009 + zlib.crc32(arch.encode()) % 1000  # model init
    assert derive(seed, rank + 1, prime=STREAM) == seed * 1_000_003 + rank + 1  # token streams
    assert derive(seed, 4_242, prime=STREAM) == seed * 1_000_003 + 4_242  # distillation
    assert derive(seed, rank, 3, prime=(SMALL, LARGE)) == (seed * 7_919 + rank) * 104_729 + 3  # privacy noise
    assert derive(seed, rnd, rank, prime=(STREAM, RANK)) == ((seed * 1_000_003 + rnd) * 1009 + rank) % 2**63
    assert derive(seed, 17, prime=SMALL) == seed * 7919 + 17  # cooperative draws


def test_the_modulo_never_bites_for_scenario_seeds():
    """The largest chain in use stays under 2**63 for the largest seed and rank, so taking
    the result mod 2**63 (manual_seed's range) changed no number."""
    top = (MAX_SEED * SMALL + MAX_WORLD) * LARGE + 3
    assert top < 2**63 and derive(MAX_SEED, MAX_WORLD, 3, prime=(SMALL, LARGE)) == top
    assert ((MAX_SEED * STREAM + 10**6) * RANK + MAX_WORLD) < 2**63


def test_primes_and_salts_must_pair():
    with pytest.raises(ValueError, match="2 salts for 1 primes"):
        derive(1, 2, 3, prime=(7,))
