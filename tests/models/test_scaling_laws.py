"""The scaling-law fits recover the coefficients of data the law itself made, with noise;
the schedule's areas and the steps to a target are what their definitions say."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from oresearcher.models import scaling_laws as S

SIZES = np.array([25e3, 50e3, 1e5, 2.3e5, 4.5e5, 8e5, 1.5e6])


def noisy(values, sd, seed):
    return np.asarray(values) * np.exp(np.random.default_rng(seed).normal(0.0, sd, np.size(values)))


@settings(max_examples=12, deadline=None)
@given(A=st.floats(5, 200), alpha=st.floats(0.15, 0.7), C=st.floats(1.5, 4.0), seed=st.integers(0, 99))
def test_size_law_recovers_its_coefficients_from_noisy_points(A, alpha, C, seed):
    # the reducible part must be visible over the sizes: at least 5% of the loss at the smallest
    if A * SIZES[0] ** -alpha < 0.05 * C:
        return
    loss = noisy(S.power_law(SIZES, A, alpha, C), 1e-4, seed)
    fit = S.fit_power(SIZES, loss)
    assert fit.converged >= 1
    pred = S.power_law(SIZES, **fit.coef)
    assert np.max(np.abs(np.log(pred / loss))) < 1e-3  # the curve, to the noise
    assert abs(fit.coef["C"] - C) / C < 0.05
    assert abs(fit.coef["alpha"] - alpha) < 0.1


@settings(max_examples=6, deadline=None)
@given(E=st.floats(1.5, 3.0), alpha=st.floats(0.2, 0.5), beta=st.floats(0.2, 0.5), seed=st.integers(0, 99))
def test_chinchilla_form_recovers_its_coefficients_from_two_budgets_a_size(E, alpha, beta, seed):
    n = np.repeat(SIZES[:5], 3)
    d = n * np.tile([2.0, 5.0, 20.0], 5)
    A, B = 10.0 * 25e3 ** alpha, 10.0 * 5e4 ** beta  # each term ~10% of the loss at the smallest run
    loss = noisy(S.chinchilla(n, d, E, A, B, alpha, beta), 1e-4, seed)
    fit = S.fit_chinchilla(n, d, loss)
    pred = S.chinchilla(n, d, **fit.coef)
    assert np.max(np.abs(np.log(pred / loss))) < 1e-3
    assert abs(fit.coef["E"] - E) / E < 0.05
    assert abs(fit.coef["alpha"] - alpha) < 0.1 and abs(fit.coef["beta"] - beta) < 0.1


def cosine(steps, peak):
    from oresearcher.tasks.text.pretrain import lr_at

    return np.array([lr_at(i, steps, peak) for i in range(steps)])


@settings(max_examples=5, deadline=None)
@given(beta=st.floats(0.3, 0.8), C=st.floats(0.5, 3.0), seed=st.integers(0, 99))
def test_whole_curve_law_recovers_its_coefficients_and_predicts_an_unseen_size(beta, C, seed):
    coef = {"E": 2.0, "A": 30.0, "alpha": 0.3, "B": 0.8, "beta": beta, "C": C}
    cols = []
    for n, steps in zip(SIZES[:4], (60, 120, 240, 480)):
        s1, s2 = S.areas(cosine(steps, 3e-3))
        cols.append((np.full(steps, n), s1, s2))
    n, s1, s2 = (np.concatenate(c) for c in zip(*cols))
    loss = noisy(S.curve_law(n, s1, s2, **coef), 1e-4, seed)
    fit = S.fit_curves(n, s1, s2, loss)
    assert abs(fit.coef["beta"] - beta) < 0.05 and abs(fit.coef["E"] + fit.coef["A"] / 1e5 ** fit.coef["alpha"]
                                                        - 2.0 - 30.0 / 1e5 ** 0.3) < 0.02
    held = cosine(960, 3e-3)
    truth = S.curve_law(SIZES[4], *S.areas(held), **coef)
    target = float(truth[800])
    want = S.steps_to(coef, SIZES[4], held, target)
    got = S.steps_to(fit.coef, SIZES[4], held, target)
    assert got is not None and abs(got / want - 1) < 0.05


@given(lrs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60))
def test_areas_are_the_running_sum_and_the_smoothed_decreases(lrs):
    s1, s2 = S.areas(lrs, momentum=0.5)
    assert np.allclose(s1, np.cumsum(lrs))
    assert np.all(np.diff(s2) >= -1e-12)  # only decreases anneal: S2 never falls
    m, total = 0.0, 0.0
    for i in range(len(lrs)):  # the definition, step by step
        m = 0.5 * m + (max(0.0, lrs[i - 1] - lrs[i]) if i else 0.0)
        total += m
    assert math.isclose(s2[-1], total, rel_tol=1e-9, abs_tol=1e-12)


def test_a_constant_rate_anneals_nothing_and_steps_to_is_the_first_crossing():
    s1, s2 = S.areas([0.01] * 50)
    assert np.all(s2 == 0)
    coef = {"E": 1.0, "A": 0.0, "alpha": 0.0, "B": 1.0, "beta": 1.0, "C": 0.0}  # L = 1 + 1 / S1
    # 1 + 1 / (0.01 k) <= 3 first at k = 50 (1 + 2 = 3)
    assert S.steps_to(coef, 1e5, [0.01] * 50, 3.0) == 50
    assert S.steps_to(coef, 1e5, [0.01] * 49, 3.0) is None


@given(r=st.floats(-1.0, 1.0), delta=st.floats(1e-4, 0.1))
def test_huber_is_quadratic_inside_delta_and_linear_outside(r, delta):
    h = float(S.huber(np.array([r]), delta)[0])
    if abs(r) <= delta:
        assert math.isclose(h, 0.5 * r * r, rel_tol=1e-12, abs_tol=1e-300)
    else:
        assert math.isclose(h, delta * (abs(r) - 0.5 * delta), rel_tol=1e-12)


def test_bootstrap_intervals_bracket_the_fit_and_shrink_with_the_noise():
    truth = (40.0, 0.35, 3.2)
    widths = []
    for sd in (1e-3, 1e-2):
        loss = noisy(S.power_law(SIZES, *truth), sd, 3)
        fit = S.fit_power(SIZES, loss)
        b = S.bootstrap(lambda x, y: S.fit_power(x, y, grid=S.grid_near(fit)), (SIZES,), loss, fit, draws=60)
        lo, hi = b.interval["C"]
        assert lo <= fit.coef["C"] <= hi
        widths.append(hi - lo)
    assert widths[0] < widths[1]


def test_a_single_start_far_away_is_what_the_grid_guards_against():
    # Besiroglu et al. 2024: one start can stop short; the grid's best is at least as good as any start
    loss = S.power_law(SIZES, 40.0, 0.35, 3.2)
    grid = S.fit_power(SIZES, loss)
    one = S.fit_power(SIZES, loss, grid={"a": (20.0,), "alpha": (2.5,), "c": (-4.0,)})
    assert grid.objective <= one.objective + 1e-15


def test_non_embedding_parameters_leave_out_the_tables_and_an_untied_head():
    from oresearcher.models import PRESETS, n_non_embedding, n_params

    c = PRESETS["gpt-1.3b"]  # tied: token and position tables only
    assert n_params("gpt-1.3b") - n_non_embedding("gpt-1.3b") == (c.vocab_size + c.max_seq_len) * c.d_model
    c = PRESETS["llama-7b"]  # rotary (no position table), an untied output layer
    assert n_params("llama-7b") - n_non_embedding("llama-7b") == 2 * c.vocab_size * c.d_model
    assert n_non_embedding("text-25k") == 25_472


@given(peak=st.floats(1e-4, 1e-1), ref=st.floats(1e-4, 1e-1), steps=st.integers(20, 200))
def test_at_rate_is_the_paper_at_gamma_1_and_the_schedules_shape_at_the_reference_at_gamma_0(peak, ref, steps):
    lrs = cosine(steps, peak)
    assert np.array_equal(S.at_rate(lrs, 1.0, ref), lrs)
    shape = S.at_rate(lrs, 0.0, ref)  # what the same schedule would be at peak ref
    assert np.allclose(shape, cosine(steps, ref), rtol=1e-9)
    s1, s2 = S.areas(shape)
    r1, r2 = S.areas(cosine(steps, ref))
    assert np.allclose(s1, r1, rtol=1e-9) and np.allclose(s2, r2, rtol=1e-9, atol=1e-15)


QUICK = {"e": (0.0, 1.0), "a": (2.0, 4.0), "alpha": (0.3,), "b": (0.0,), "beta": (0.5,), "c": (0.0,)}  # 4 starts


@settings(max_examples=4, deadline=None)
@given(gamma=st.sampled_from([0.0, 0.5, 1.0]), seed=st.integers(0, 99))
def test_profile_rate_recovers_the_rates_weight_of_curves_made_at_three_peaks(gamma, seed):
    coef = {"E": 2.0, "A": 40.0, "alpha": 0.3, "B": 0.9, "beta": 0.5, "C": 1.0}
    ref, cols = 6e-3, []
    for n in SIZES[:4]:
        steps = int(20 * n / 1024)
        for peak in (3e-3, 6e-3, 1.2e-2):  # the tuning grid
            s1, s2 = S.areas(S.at_rate(cosine(steps, peak), gamma, ref))
            idx = np.unique(np.geomspace(steps // 10, steps - 1, 30).astype(int))
            cols.append((np.full(idx.size, n), s1[idx], s2[idx], noisy(S.curve_law(n, s1[idx], s2[idx], **coef),
                                                                       1e-4, seed)))

    def fit_at(g):
        n, a, b, loss = (np.concatenate(c) for c in zip(*cols))
        scale = np.concatenate([np.full(c[0].size, (p / ref) ** (g - gamma)) for c, p in
                                zip(cols, [3e-3, 6e-3, 1.2e-2] * 4)])
        return S.fit_curves(n, a * scale, b * scale, loss, grid=QUICK)  # the areas as read at g

    got, objectives = S.profile_rate(fit_at)
    assert got == gamma and len(objectives) == len(S.RATE_EXPONENTS)
    assert objectives[gamma] < min(v for g, v in objectives.items() if abs(g - gamma) >= 0.5)
