"""Shared fixtures of the text task's tests: one small prepared corpus per session.

The King James Bible with a tokenizer trained on its own training books at 300 tokens
prepares in ~3 s (the State of the Union corpus, 3x larger, in ~6 s), in a temporary
cache, so no test touches the user's cache."""
import pytest

from oresearcher.tasks.text.data import prepare

SMALL_VOCAB = 300


@pytest.fixture(scope="session")
def text_cache(tmp_path_factory):
    """A session's text cache folder, with the Bible prepared at SMALL_VOCAB."""
    root = tmp_path_factory.mktemp("text-cache")
    prepare("bible", "train", vocab_size=SMALL_VOCAB, cache_dir=root, tokenizer_corpus="bible")
    return root


def _small(split="train", cache_dir=None):
    return prepare("bible", split, vocab_size=SMALL_VOCAB, cache_dir=cache_dir,
                   tokenizer_corpus="bible")


@pytest.fixture(scope="session")
def small():
    """``small(split, cache_dir)``: the Bible at SMALL_VOCAB with its own tokenizer."""
    return _small


@pytest.fixture(scope="session")
def bible_train(text_cache):
    return _small("train", text_cache)


@pytest.fixture(scope="session")
def bible_test(text_cache):
    return _small("test", text_cache)
