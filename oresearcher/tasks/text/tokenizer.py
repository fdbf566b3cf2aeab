"""The text task's tokenizer: byte-level BPE trained with Hugging Face ``tokenizers``.

Byte-level, as GPT-2's: every UTF-8 byte is a base token (256), so any text encodes and
decodes exactly (no unknown token), and the file loads in ``transformers`` as a GPT-2
fast tokenizer. Trained on the training documents of one corpus only (validation and
test text never shapes the vocabulary), with one special token, ``<|endoftext|>``,
placed between documents. ``tokenizers`` puts special tokens first, so its id is 0.

Vocabulary size: at least 257 (the 256 bytes and the end-of-text token) and at most
65536 (token ids are stored as uint16); a size the training text cannot reach (too few
distinct pairs left to merge) is refused after training, in one line.
"""
from __future__ import annotations

from typing import Iterable

from ...errors import UserError

EOT = "<|endoftext|>"
MIN_VOCAB = 257  # 256 byte tokens + <|endoftext|>
MAX_VOCAB = 1 << 16  # ids are stored as uint16


def check_vocab_size(vocab_size) -> int:
    """``vocab_size`` as an int, or a UserError saying which sizes can be trained."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise UserError(f"vocab_size must be an integer, got {vocab_size!r}")
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise UserError(f"vocab_size {vocab_size} cannot be trained: a byte-level BPE needs at "
                        f"least {MIN_VOCAB} (256 bytes + end-of-text) and ids are stored as "
                        f"uint16, so at most {MAX_VOCAB}")
    return vocab_size


def train(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size`` tokens, trained on
    ``texts``. Deterministic: the same texts and size give the same file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    check_vocab_size(vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise UserError(f"vocab_size {vocab_size} cannot be trained: the training text gives "
                        f"only {tok.get_vocab_size()} tokens (pairs seen at least twice); "
                        "choose a smaller size")
    return tok


def load(path):
    """The tokenizer saved at ``path`` (``tokenizer.json``)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def token_bytes(tok) -> list[int]:
    """For each id, how many bytes it decodes to (0 for the end-of-text token): a byte-level
    piece spells each byte as one printable character, so its length is its byte count."""
    sizes = [0] * tok.get_vocab_size()
    for piece, i in tok.get_vocab().items():
        sizes[i] = 0 if piece == EOT else len(piece)
    return sizes
