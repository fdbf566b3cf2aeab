"""oresearcher.tasks.datacache: the cached arrays are the built ones, and a bad cache never
costs more than a rebuild."""
import numpy as np
import pytest
import torch

from oresearcher.tasks.datacache import cached_arrays


def _counting_build(calls):
    def build():
        calls.append(1)
        return {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([3, 1, 2], dtype=np.int64)}
    return build


def _same(x, y):
    assert x.keys() == y.keys()
    for k in x:
        assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k])


def test_second_call_reads_the_file_and_a_new_key_rebuilds(tmp_path, monkeypatch):
    monkeypatch.setenv("ORESEARCHER_CACHE", str(tmp_path))
    calls = []
    first = cached_arrays("t", "k1", _counting_build(calls))
    second = cached_arrays("t", "k1", _counting_build(calls))
    assert len(calls) == 1 and len(list(tmp_path.glob("t-*.npz"))) == 1
    _same(first, second)
    cached_arrays("t", "k2", _counting_build(calls))  # another version: another file
    assert len(calls) == 2 and len(list(tmp_path.glob("t-*.npz"))) == 2
    assert not list(tmp_path.glob(".t-*"))  # no temporary file left


def test_a_corrupt_file_is_rebuilt_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("ORESEARCHER_CACHE", str(tmp_path))
    calls = []
    good = cached_arrays("t", "k", _counting_build(calls))
    (path,) = tmp_path.glob("t-*.npz")
    path.write_bytes(b"not a zip file")
    _same(cached_arrays("t", "k", _counting_build(calls)), good)
    assert len(calls) == 2
    _same(cached_arrays("t", "k", _counting_build(calls)), good)  # replaced: read again
    assert len(calls) == 2


@pytest.mark.parametrize("where", ["off", "file"])
def test_no_cache_or_an_unwritable_one_still_builds(tmp_path, monkeypatch, where):
    target = tmp_path / "plain-file"
    target.write_text("x")  # a file where the folder should be: mkdir fails
    monkeypatch.setenv("ORESEARCHER_CACHE", "off" if where == "off" else str(target))
    calls = []
    for _ in range(2):
        _same(cached_arrays("t", "k", _counting_build(calls)), _counting_build([])())
    assert len(calls) == 2


def test_digits_split_from_the_cache_is_scikit_learns(tmp_path, monkeypatch):
    from oresearcher.tasks import digits

    monkeypatch.setenv("ORESEARCHER_CACHE", str(tmp_path))
    digits.load_splits.cache_clear()
    try:
        written = digits.load_splits()
        digits.load_splits.cache_clear()
        read = digits.load_splits()
    finally:
        digits.load_splits.cache_clear()
    fresh = digits._split_arrays()
    assert len(list(tmp_path.glob("digits-*.npz"))) == 1
    for split in ("train", "val", "test"):
        for got in (written, read):
            X, y = got[split]
            assert X.dtype == torch.float32 and np.array_equal(X.numpy(), fresh[f"{split}_X"])
            assert np.array_equal(y.numpy(), fresh[f"{split}_y"])

