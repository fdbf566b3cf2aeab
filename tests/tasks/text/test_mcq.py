"""The multiple-choice benchmark (oresearcher/tasks/text/mcq.py): construction, scoring
with hand-made scorers, the tie rule, the interval, the causal-LM adapter."""
import csv
import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from oresearcher.errors import UserError
from oresearcher.tasks.text import mcq

# the digest of build_questions(Bible test, k=4, n=30, seed=0): a change to the construction
# changes it; then bump MCQ_VERSION and put the new digest here
GOLDEN = {1: "ac87c5bb2f9b9374"}  # the same at every vocabulary size: built from text


@pytest.fixture(scope="module")
def qs(bible_test):
    return mcq.build_questions(bible_test, k=4, n=60, seed=0)


def _digest(qset):
    h = hashlib.sha256()
    for q in qset.questions:
        h.update(repr((q.qid, q.context, q.choices, q.answer)).encode())
    return h.hexdigest()[:16]


def test_questions_are_well_formed(qs, bible_test):
    assert len(qs) == 60 and qs.version == mcq.MCQ_VERSION and qs.k == 4
    tok = bible_test.tokenizer()
    for q in qs.questions:
        text = bible_test.text(q.doc_id)
        assert len(set(q.choices)) == 4 and 0 <= q.answer < 4
        assert q.context + " " + q.choices[q.answer] in text  # the true continuation follows
        assert all(c in text for c in q.choices)  # distractors: the same document
        assert len(q.context) <= mcq.CONTEXT_CHARS
        for c, ids, b in zip(q.choices, q.choice_ids, q.choice_bytes):
            assert tok.decode(list(ids)) == " " + c and b == len(c.encode())
            assert mcq.MIN_CHARS <= len(c) <= mcq.MAX_CHARS
        assert tok.decode(list(q.context_ids)) == q.context
    assert len({q.qid for q in qs.questions}) == 60
    assert len({q.doc_id for q in qs.questions}) > 1
    # answer positions are drawn, not fixed: each letter is the answer somewhere
    assert {q.answer for q in qs.questions} == {0, 1, 2, 3}


def test_deterministic_and_versioned(qs, bible_test):
    again = mcq.build_questions(bible_test, k=4, n=60, seed=0)
    assert again == qs
    assert mcq.build_questions(bible_test, k=4, n=60, seed=1) != qs
    small = mcq.build_questions(bible_test, k=4, n=30, seed=0)
    golden = GOLDEN.get(mcq.MCQ_VERSION)
    if golden is not None:
        assert _digest(small) == golden, "the questions changed: bump MCQ_VERSION"


def _oracle(qset, wrong_per_token=-1.0):
    truth = {(q.context_ids, q.choice_ids[q.answer]) for q in qset.questions}
    return lambda ctx, ids: [0.0 if (tuple(ctx), tuple(ids)) in truth else wrong_per_token] * len(ids)


def test_oracle_scores_everything(qs):
    r = mcq.score(_oracle(qs), qs)
    assert r.acc_norm == r.acc == 1.0 and r.n == 60 and r.chance == 0.25
    assert r.ci95[1] == 1.0 and 0.9 < r.ci95[0] < 1.0
    assert r.by_corpus["bible"]["n"] == 60 and r.credits == (1.0,) * 60


def test_blind_scorer_scores_chance_exactly(qs):
    r = mcq.score(lambda ctx, ids: np.zeros(len(ids)), qs)  # every choice ties
    assert r.acc_norm == r.acc == 0.25
    assert r.ci95[0] < 0.25 < r.ci95[1]


def test_sum_or_per_token_logprobs_agree(qs):
    per_token = mcq.score(lambda ctx, ids: -np.arange(1, len(ids) + 1) / 7, qs)
    summed = mcq.score(lambda ctx, ids: float(-np.arange(1, len(ids) + 1).sum() / 7), qs)
    assert per_token == summed
    with pytest.raises(ValueError, match="log-probs for"):
        mcq.score(lambda ctx, ids: [0.0] * (len(ids) + 1), qs)


def test_normalization_is_per_byte(qs):
    # log-likelihood proportional to the byte length: per byte every choice ties (chance);
    # unnormalized, the shortest choice wins
    q0 = qs.questions[0]
    lengths = {ids: b for q in qs.questions for ids, b in zip(q.choice_ids, q.choice_bytes)}
    r = mcq.score(lambda ctx, ids: -0.5 * lengths[tuple(ids)], [q0])
    assert r.acc_norm == 0.25
    assert r.acc == float(q0.choice_bytes[q0.answer] == min(q0.choice_bytes))


@given(st.lists(st.integers(-3, 3), min_size=2, max_size=8))
def test_tie_rule_shares_one_point(scores):
    credits = [mcq.credit(scores, a) for a in range(len(scores))]
    assert sum(credits) == pytest.approx(1.0)  # over all answer positions: one point in all
    best = max(scores)
    m = scores.count(best)
    assert all(c == (1 / m if s == best else 0.0) for c, s in zip(credits, scores))


@given(st.integers(0, 500), st.integers(1, 500))
def test_wilson_interval_bounds(s, n):
    s = min(s, n)
    lo, hi = mcq.wilson(s, n)
    assert 0.0 <= lo <= s / n <= hi <= 1.0
    lo4, hi4 = mcq.wilson(4 * s, 4 * n)
    assert hi4 - lo4 < hi - lo  # more questions, a narrower interval


def test_mmlu_csv(qs, tmp_path):
    path = tmp_path / "q.csv"
    qs.write_mmlu_csv(path)
    rows = list(csv.reader(open(path, encoding="utf-8")))
    assert len(rows) == 60 and all(len(r) == 6 for r in rows)
    assert [r[5] for r in rows] == ["ABCD"[q.answer] for q in qs.questions]


def test_combined_corpora_and_bad_k(qs, bible_test):
    both = qs + mcq.build_questions(bible_test, k=4, n=5, seed=9)
    assert len(both) == 65
    for bad in (1, 11):
        with pytest.raises(UserError, match="need 2 <= k"):
            mcq.build_questions(bible_test, k=bad, n=5)


def test_sentences_keep_titles_and_initials():
    text = 'Mr. Smith went to the U.S. Senate. "Why?" he asked!\nNew line here. And J. Doe came.'
    got = [text[s:e] for s, e in mcq.sentences(text)]
    assert got == ["Mr. Smith went to the U.S. Senate.", '"Why?" he asked!', "New line here.",
                   "And J. Doe came."]


def test_causal_lm_adapter_matches_manual_log_softmax():
    torch.manual_seed(0)
    table = torch.randn(50, 50)

    def logits_fn(ids):  # a bigram "model": logits depend on the previous token only
        return table[ids]
    fn = mcq.causal_lm_logprobs(logits_fn, max_len=6)
    ctx, cont = [1, 2, 3, 4, 5, 6, 7], [8, 9, 10]
    got = fn(ctx, cont)
    want = [torch.log_softmax(table[p], -1)[t].item() for p, t in [(7, 8), (8, 9), (9, 10)]]
    assert np.allclose(got, want, atol=1e-6)
    with pytest.raises(UserError, match="longer than the model's context"):
        fn(ctx, list(range(7)))


def test_context_free_scorer_is_at_chance(bible_train, bible_test):
    # distractors are drawn from the same population as answers, so a unigram model, which
    # ignores the context, cannot beat chance per byte (deterministic: fixed seed and data)
    counts = np.bincount(np.asarray(bible_train.tokens), minlength=bible_train.vocab_size) + 0.1
    logp = np.log(counts / counts.sum())
    qset = mcq.build_questions(bible_test, k=4, n=300, seed=0)
    r = mcq.score(lambda ctx, ids: logp[list(ids)], qset)
    assert r.ci95[0] < 0.25 < r.ci95[1]


def test_batched_choices_equal_one_at_a_time(qs):
    torch.manual_seed(1)
    emb, pos = torch.randn(300, 16), torch.randn(256, 16)
    head = torch.randn(16, 300)

    def logits_fn(ids):  # causal: position t mixes tokens 0..t (a running mean), no padding leak
        h = emb[ids] + pos[:ids.shape[1]]
        h = h.cumsum(1) / torch.arange(1, ids.shape[1] + 1).unsqueeze(1)
        return h @ head
    scorer = mcq.causal_lm_logprobs(logits_fn, max_len=256)
    for q in qs.questions[:5]:
        together = scorer.many(q.context_ids, q.choice_ids)
        alone = [scorer(q.context_ids, c) for c in q.choice_ids]
        assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(together, alone))
    batched = mcq.score(scorer, qs.questions[:10])
    plain = mcq.score(lambda c, x: scorer(c, x), qs.questions[:10])
    assert batched.credits == plain.credits


def test_a_token_bound_leaves_out_the_questions_whose_choices_do_not_fit(bible_test):
    free = mcq.build_questions(bible_test, k=4, n=60, seed=0)
    longest = sorted(max(map(len, q.choice_ids)) for q in free.questions)
    bound = longest[len(longest) // 2]
    kept = mcq.build_questions(bible_test, k=4, n=60, seed=0, max_tokens=bound)
    assert len(kept) == 60 and all(max(map(len, q.choice_ids)) <= bound for q in kept.questions)
    assert kept != free  # the long ones were replaced by others, not cut
    with pytest.raises(UserError, match="no 4-way question"):
        mcq.build_questions(bible_test, k=4, n=5, seed=0, max_tokens=1)
