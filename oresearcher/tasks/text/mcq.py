"""A multiple-choice benchmark in MMLU's format, built from the test documents of a corpus.

    from oresearcher.tasks.text.mcq import build_questions, score, causal_lm_logprobs
    qs = build_questions(prepare("sotu", "test"), k=4, n=200, seed=0)
    result = score(causal_lm_logprobs(lambda ids: model(ids), max_len=128), qs)
    result.acc_norm, result.ci95, result.chance

A question is a passage of a held-out document (one or more whole sentences, at most
:data:`CONTEXT_CHARS` characters) and ``k`` candidate next sentences: the true one and
``k - 1`` sentences taken from elsewhere in the same document (at least
:data:`MIN_GAP` sentences away, within :data:`LENGTH_RATIO` of its length, and themselves
eligible as answers, so that true and false choices are drawn alike), in a seeded random
order. Same
document, same style, same vocabulary: only the flow of the text tells the true
continuation, the ``HellaSwag`` idea with real continuations for endings.

Scoring is cloze-style, as lm-evaluation-harness scores HellaSwag (and MMLU when a model is
too small to answer with a letter): each choice's log-likelihood given the context, summed
over its tokens; the pick is the best. ``acc_norm``, the headline, divides each sum by the
choice's length in UTF-8 bytes, as the harness's ``acc_norm`` divides by length in
characters (bytes here, the unit of bits per byte; the same for ASCII text). Per byte, not
per token, because the byte length does not depend on the tokenizer: scores stay
comparable across vocabulary sizes, and a choice does not gain from being cut into more
or fewer tokens. ``acc`` (unnormalized) is reported beside it.

Ties (choices whose scores are equal to within 1e-9 of the best) earn ``1/m`` of a point
when the answer is one of the ``m`` tied: the expected score of a random tie-break, so a
scorer that cannot tell choices apart scores chance exactly. Accuracy comes with a 95%
Wilson interval; chance is ``1/k``. The construction is deterministic in (documents, k, n,
seed) and versioned (:data:`MCQ_VERSION`, bumped whenever a question could change).
"""
from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ...errors import UserError

MCQ_VERSION = 1
CONTEXT_CHARS = 400  # the passage: whole sentences before the answer, at most this long
MIN_CHARS, MAX_CHARS = 40, 240  # a sentence that can be an answer or a distractor
MIN_GAP = 3  # a distractor is at least this many sentences from the answer
LENGTH_RATIO = 2.0  # a distractor is within this factor of the answer's length
MCQ_SALT = 0x4D43  # names the benchmark's random stream
LETTERS = "ABCDEFGHIJ"

_ABBREV = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|St|Gen|Gov|Sen|Rep|Jr|Sr|No|Co|Lt|Col|Capt|Hon|"
                     r"Messrs|Vol|vs|etc|viz|[A-Z])\.|\bU\.S\.|\bi\.e\.|\be\.g\.)$")
_BOUNDARY = re.compile(r"[.!?][\"'”’)]*\s+(?=[\"“‘(]?[A-Z])|\n+")


@dataclass(frozen=True)
class Question:
    """One k-way question: ``context`` then one of ``choices``; ``answer`` indexes the true
    one. ``*_ids``: the same texts tokenized (each choice with a leading space, as it follows
    the context); ``choice_bytes``: each choice's UTF-8 length, for ``acc_norm``."""
    qid: str
    corpus: str
    doc_id: str
    context: str
    choices: tuple
    answer: int
    context_ids: tuple
    choice_ids: tuple
    choice_bytes: tuple


@dataclass(frozen=True)
class QuestionSet:
    version: int
    k: int
    seed: int
    questions: tuple

    def __len__(self):
        return len(self.questions)

    def __add__(self, other: "QuestionSet") -> "QuestionSet":
        if (other.version, other.k) != (self.version, self.k):
            raise ValueError("question sets of different versions or k")
        return QuestionSet(self.version, self.k, self.seed, self.questions + other.questions)

    def write_mmlu_csv(self, path) -> None:
        """MMLU's file format: one row per question, no header: question, the choices, the
        answer's letter."""
        from ...files import write_text

        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        for q in self.questions:
            w.writerow([q.context, *q.choices, LETTERS[q.answer]])
        write_text(Path(path), buf.getvalue())


def sentences(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of ``text``'s sentences: a boundary is end punctuation
    (closing quotes allowed) then space then a capital, or a line break; not after a title
    or initial (``Mr.``, ``U.S.``, ``J.``)."""
    spans, start = [], 0
    for m in _BOUNDARY.finditer(text):
        if text[m.start()] == "\n":
            end = m.start()
        else:
            end = m.start() + len(m.group().rstrip())  # the punctuation and closing quotes
            if text[m.start()] == "." and _ABBREV.search(text[start:m.start() + 1]):
                continue
        if text[start:end].strip():
            spans.append((start, end))
        start = m.end()
    if text[start:].strip():
        spans.append((start, len(text.rstrip())))
    return spans


def _candidates(text: str, spans) -> tuple[list[str], list[int]]:
    """The document's sentences and the indexes that can be answers: a length in range and
    a passage of at most CONTEXT_CHARS before it, within one paragraph."""
    sents = [text[s:e] for s, e in spans]
    ok = []
    for j in range(1, len(spans)):
        ctx_start = spans[j - 1][0]
        if MIN_CHARS <= len(sents[j]) <= MAX_CHARS and spans[j][0] - ctx_start <= CONTEXT_CHARS \
                and "\n" not in text[ctx_start:spans[j][0]]:
            ok.append(j)
    return sents, ok


def _context(text: str, spans, j: int) -> str:
    """Whole sentences of the paragraph before sentence ``j``, at most CONTEXT_CHARS."""
    i = j - 1
    while i > 0 and spans[j][0] - spans[i - 1][0] <= CONTEXT_CHARS \
            and "\n" not in text[spans[i - 1][0]:spans[j][0]]:
        i -= 1
    return text[spans[i][0]:spans[j - 1][1]]


def _distractors(sents: list[str], ok: list[int], j: int, k: int, rng) -> list[str] | None:
    """k - 1 other sentences of the document for answer ``j``, or None when too few fit.
    Drawn from the sentences that could themselves be answers (``ok``), so true and false
    choices come from one population and a scorer that ignores the context is at chance."""
    true = sents[j]
    pool = sorted({sents[i] for i in ok if abs(i - j) >= MIN_GAP and sents[i] != true
                   and 1 / LENGTH_RATIO <= len(sents[i]) / len(true) <= LENGTH_RATIO})
    if len(pool) < k - 1:
        return None
    return [pool[i] for i in rng.choice(len(pool), size=k - 1, replace=False)]


def build_questions(data, k: int = 4, n: int = 200, seed: int = 0, max_tokens: int | None = None) -> QuestionSet:
    """Up to ``n`` k-way questions from the documents of ``data`` (a :class:`TokenData`,
    normally a test split), the same for the same documents, k, n, seed and ``max_tokens``
    (a question with a choice of more tokens is not asked: a model must see the choice
    and some context in its window; None: no bound)."""
    if not 2 <= k <= len(LETTERS) or n < 1:
        raise UserError(f"multiple choice: k {k}, n {n}: need 2 <= k <= {len(LETTERS)}, n >= 1")
    tok = data.tokenizer()
    texts = {d: tok.decode([int(t) for t in data.tokens[s:e]]) for d, s, e in data.documents}
    pool = []  # (doc, answer sentence index), in document order
    parsed = {}
    for doc, text in texts.items():
        spans = sentences(text)
        parsed[doc] = (spans, *_candidates(text, spans))
        pool += [(doc, j) for j in parsed[doc][2]]
    rng = np.random.default_rng([MCQ_SALT, MCQ_VERSION, int(seed), k])
    out = []
    for p in rng.permutation(len(pool)):  # random order, so the n taken come from every document
        doc, j = pool[p]
        spans, sents, ok = parsed[doc]
        q_rng = np.random.default_rng([MCQ_SALT, MCQ_VERSION, int(seed), k, int(p)])
        wrong = _distractors(sents, ok, j, k, q_rng)
        if wrong is None:
            continue
        choices = [sents[j]] + wrong
        order = q_rng.permutation(k)
        choices = tuple(choices[i] for i in order)
        context = _context(texts[doc], spans, j)
        choice_ids = tuple(tuple(tok.encode(" " + c, add_special_tokens=False).ids) for c in choices)
        if max_tokens is not None and max(map(len, choice_ids)) > max_tokens:
            continue
        out.append(Question(
            qid=f"{data.corpus}/{doc}/{j}", corpus=data.corpus, doc_id=doc, context=context,
            choices=choices, answer=int(np.argmin(order)),
            context_ids=tuple(tok.encode(context, add_special_tokens=False).ids), choice_ids=choice_ids,
            choice_bytes=tuple(len(c.encode("utf-8")) for c in choices)))
        if len(out) == n:
            break
    if not out:
        raise UserError(f"{data.corpus} {data.split}: no {k}-way question can be built")
    out.sort(key=lambda q: q.qid)
    return QuestionSet(MCQ_VERSION, k, int(seed), tuple(out))


def wilson(successes: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval for a proportion (95% at the default z): it stays inside
    [0, 1] and behaves at 0 and n successes, where the normal interval does not."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)  # exact at the ends, where rounding
    hi = 1.0 if successes >= n else min(1.0, centre + half)  # would put p itself outside
    return (min(lo, p), max(hi, p))


def credit(scores: Sequence[float], answer: int) -> float:
    """1 when the answer alone has the best score, 1/m when it ties with m - 1 others at
    the best (within 1e-9 relative), else 0."""
    s = np.asarray(scores, dtype=np.float64)
    if not np.all(np.isfinite(s)):
        raise ValueError(f"scores must be finite, got {s}")
    best = s.max()
    tied = s >= best - 1e-9 * max(1.0, abs(best))
    return float(tied[answer]) / int(tied.sum())


@dataclass(frozen=True)
class Score:
    """Accuracy of one scorer on a question set (see the module docstring)."""
    n: int
    k: int
    chance: float
    acc_norm: float
    ci95: tuple
    acc: float
    acc_ci95: tuple
    by_corpus: dict
    credits: tuple = field(repr=False)  # per question, acc_norm's credit: for paired comparisons
    version: int = MCQ_VERSION
    normalization: str = "bytes"

    def line(self) -> str:
        lo, hi = self.ci95
        return (f"multiple choice ({self.k}-way, n={self.n}): acc_norm {self.acc_norm:.3f} "
                f"[95% CI {lo:.3f}-{hi:.3f}], acc {self.acc:.3f}, chance {self.chance:.3f}")


def score(logprob_fn: Callable, qs: QuestionSet | Iterable[Question]) -> Score:
    """Score ``logprob_fn(context_ids, continuation_ids)`` -> the continuation tokens'
    log-probabilities (a sequence, one per token, or their sum) on the questions."""
    questions = tuple(qs.questions if isinstance(qs, QuestionSet) else qs)
    if not questions:
        raise ValueError("no questions to score")
    k = len(questions[0].choices)
    norm, raw, corpus_of = [], [], []
    for q in questions:
        if isinstance(logprob_fn, CausalLMScorer):
            outs = logprob_fn.many(q.context_ids, q.choice_ids)
        else:
            outs = [logprob_fn(list(q.context_ids), list(ids)) for ids in q.choice_ids]
        lls = []
        for ids, out in zip(q.choice_ids, outs):
            out = np.asarray(out, dtype=np.float64)
            if out.ndim == 1 and len(out) != len(ids):
                raise ValueError(f"{q.qid}: {len(out)} log-probs for {len(ids)} tokens")
            lls.append(float(out.sum()))
        norm.append(credit([ll / b for ll, b in zip(lls, q.choice_bytes)], q.answer))
        raw.append(credit(lls, q.answer))
        corpus_of.append(q.corpus)
    n = len(questions)
    by = {}
    for c in sorted(set(corpus_of)):
        got = [x for x, cc in zip(norm, corpus_of) if cc == c]
        by[c] = {"n": len(got), "acc_norm": sum(got) / len(got), "ci95": wilson(sum(got), len(got))}
    return Score(n=n, k=k, chance=1 / k, acc_norm=sum(norm) / n, ci95=wilson(sum(norm), n),
                 acc=sum(raw) / n, acc_ci95=wilson(sum(raw), n), by_corpus=by, credits=tuple(norm))


class CausalLMScorer:
    """A ``logprob_fn`` for :func:`score` from a causal LM: ``logits_fn(LongTensor[B, T])``
    -> logits [B, T, vocab], with at most ``max_len`` positions. The context is cut from the
    left to fit (as lm-evaluation-harness does); a continuation longer than ``max_len``
    cannot be scored and is a UserError. :meth:`many` scores a question's k choices in one
    batch (right-padded: a causal model's logits before the padding do not see it), which
    :func:`score` uses: one forward pass per question instead of k."""

    def __init__(self, logits_fn: Callable, max_len: int):
        self.logits_fn, self.max_len = logits_fn, int(max_len)

    def _inputs(self, context_ids, cont_ids) -> list:
        if len(cont_ids) > self.max_len:
            raise UserError(f"a choice of {len(cont_ids)} tokens is longer than the model's "
                            f"context of {self.max_len}")
        return (list(context_ids) + list(cont_ids))[:-1][-self.max_len:]

    def __call__(self, context_ids, cont_ids):
        return self.many(context_ids, [cont_ids])[0]

    def many(self, context_ids, conts) -> list:
        import torch

        rows = [self._inputs(context_ids, c) for c in conts]
        width = max(len(r) for r in rows)
        x = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            x[i, :len(r)] = torch.tensor(r)
        with torch.no_grad():
            logits = self.logits_fn(x)
        out = []
        for i, (r, c) in enumerate(zip(rows, conts)):
            logp = torch.log_softmax(logits[i, len(r) - len(c):len(r)].float(), dim=-1)
            out.append(logp.gather(1, torch.tensor(list(c)).unsqueeze(1)).squeeze(1).cpu().numpy())
        return out


def causal_lm_logprobs(logits_fn: Callable, max_len: int) -> CausalLMScorer:
    """The :class:`CausalLMScorer` of ``logits_fn`` (a model's forward) at ``max_len``."""
    return CausalLMScorer(logits_fn, max_len)
