"""Prioritized replay (oresearcher.cooperation.replay) and its sharing round (oresearcher.cooperation.replay_sharing).

Sampling frequencies against priorities (chi-square), importance weights against a slow
reference, the trees' invariants and FIFO eviction under random operations (hypothesis
state machine), exact resume, and a sharing round that loses and duplicates nothing.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from scipy.stats import chisquare

from oresearcher.cooperation.replay import PrioritizedReplay, SegmentTree, annealed_beta
from oresearcher.cooperation.replay_sharing import SharedReplay, apex_epsilons, share
from oresearcher.testing import run_programs


def _rows(k, start=0):
    return {"x": torch.arange(start, start + k, dtype=torch.float32).unsqueeze(1).repeat(1, 3),
            "id": torch.arange(start, start + k, dtype=torch.int64)}


@pytest.mark.parametrize("batch", [1, 64])
def test_sampling_frequencies_match_priorities(batch):
    pool = PrioritizedReplay(50, alpha=0.6)
    raw = np.random.default_rng(0).uniform(0.01, 5.0, 50)
    pool.add(_rows(50), priorities=raw)
    g = torch.Generator().manual_seed(1)
    counts = np.zeros(50)
    for _ in range(20_000 // batch):  # 400 expected draws per slot on average
        slots, _, _ = pool.sample(batch, g)
        np.add.at(counts, slots, 1)
    expected = (raw + pool.eps) ** 0.6
    expected = expected / expected.sum() * counts.sum()
    # batch 1 is a plain multinomial draw; batch 64 is stratified (less variance, still unbiased)
    assert chisquare(counts, expected).pvalue > 1e-3
    # and a wrong distribution is rejected: uniform frequencies would not fit these counts
    assert chisquare(counts, np.full(50, counts.sum() / 50)).pvalue < 1e-6


def test_importance_weights_against_a_slow_reference():
    pool = PrioritizedReplay(30, alpha=0.6, beta_start=0.4, beta_steps=100)
    raw = np.random.default_rng(2).uniform(0.0, 3.0, 20)
    pool.add(_rows(20), priorities=raw)
    slots, _, w = pool.sample(16, torch.Generator().manual_seed(0), step=30)
    beta = 0.4 + 0.6 * 30 / 100
    p = [(abs(r) + 1e-6) ** 0.6 for r in raw]
    probs = [x / sum(p) for x in p]
    ref_all = [(20 * q) ** -beta for q in probs]
    ref = [(20 * probs[s]) ** -beta / max(ref_all) for s in slots]
    assert np.allclose(w.numpy(), ref, rtol=1e-5)
    assert annealed_beta(0, 100) == 0.4 and annealed_beta(100, 100) == 1.0 and annealed_beta(500, 100) == 1.0


def test_sampling_never_returns_an_empty_or_zero_slot():
    pool = PrioritizedReplay(1000)
    pool.add(_rows(7), priorities=[0, 1, 0, 0, 2, 0, 0])
    pool.update_priorities([1, 4], [0.0, 0.0])  # zero raw priority still keeps eps
    pool.update_priorities([3], [5.0])
    slots, _, _ = pool.sample(4096, torch.Generator().manual_seed(0))
    assert slots.max() < 7 and pool.sums.leaves(slots).min() > 0


def test_resume_samples_exactly_the_same():
    a = PrioritizedReplay(64, beta_steps=10)
    a.add(_rows(100), priorities=np.linspace(0.1, 2, 100))
    a.update_priorities([3, 5, 3], [9.0, 0.5, 1.0])
    b = PrioritizedReplay(64, beta_steps=10)
    b.load_state_dict(a.state_dict())
    ga, gb = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for step in range(3):
        sa, ra, wa = a.sample(32, ga, step)
        sb, rb, wb = b.sample(32, gb, step)
        assert np.array_equal(sa, sb) and torch.equal(wa, wb) and torch.equal(ra["id"], rb["id"])
    a.add(_rows(5, 1000))
    b.add(_rows(5, 1000))
    assert np.array_equal(a.priorities(), b.priorities()) and a.pos == b.pos


class SumTreeMachine(RuleBasedStateMachine):
    """Random adds, updates and samples against a plain model of the pool."""

    def __init__(self):
        super().__init__()
        self.pool = PrioritizedReplay(13, alpha=0.6)
        self.model = []  # [id, stored priority] in insertion order
        self.next_id, self.g = 0, torch.Generator().manual_seed(0)

    @rule(k=st.integers(1, 20), given=st.booleans(), seed=st.integers(0, 99))
    def add(self, k, given, seed):
        raw = np.random.default_rng(seed).uniform(0, 10, k) if given else None
        max_before = self.pool.max_priority
        self.pool.add(_rows(k, self.next_id), priorities=raw)
        stored = (np.abs(raw) + 1e-6) ** 0.6 if given else np.full(k, max_before ** 0.6)
        self.model += [[self.next_id + i, stored[i]] for i in range(k)]
        self.model = self.model[-13:]  # FIFO: the newest capacity rows stay
        self.next_id += k

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def update(self, data):
        slots = data.draw(st.lists(st.integers(0, len(self.pool) - 1), min_size=1, max_size=8))
        raw = data.draw(st.lists(st.floats(0, 100), min_size=len(slots), max_size=len(slots)))
        self.pool.update_priorities(slots, raw)
        ids = self.pool.columns["id"]
        for s, r in zip(slots, raw):  # the last of repeated slots wins
            for row in self.model:
                if row[0] == int(ids[s]):
                    row[1] = (abs(r) + 1e-6) ** 0.6

    @precondition(lambda self: len(self.model) > 0)
    @rule(k=st.integers(1, 40))
    def sample(self, k):
        slots, rows, w = self.pool.sample(k, self.g)
        assert slots.max() < len(self.pool) and bool((w > 0).all()) and bool((w <= 1 + 1e-6).all())

    @invariant()
    def trees_are_consistent(self):
        for tree, op in ((self.pool.sums, np.add), (self.pool.mins, np.minimum)):
            t = tree.tree
            inner = np.arange(1, tree.size)
            assert np.allclose(t[inner], op(t[2 * inner], t[2 * inner + 1]), rtol=1e-12, atol=0)
        n = len(self.model)
        assert len(self.pool) == n
        if n:
            ids = self.pool.columns["id"][:n].tolist()
            assert sorted(ids) == [row[0] for row in self.model]  # nothing lost, nothing doubled
            by_id = {row[0]: row[1] for row in self.model}
            assert np.allclose(self.pool.priorities(), [by_id[i] for i in ids], rtol=1e-12)
            assert self.pool.sums.root == pytest.approx(sum(by_id.values()), rel=1e-12)
            assert self.pool.mins.root == pytest.approx(min(by_id.values()), rel=1e-12)  # numpy vs Python pow: 1 ulp


TestSumTree = SumTreeMachine.TestCase
TestSumTree.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_segment_tree_rebuild_equals_incremental_sets():
    a, b = SegmentTree(10, np.add, 0.0), SegmentTree(10, np.add, 0.0)
    vals = np.arange(1.0, 11.0)
    a.set(np.arange(10), vals)
    b.rebuild(vals)
    assert np.array_equal(a.tree, b.tree)


def _prefix_holds(leaves: np.ndarray, slots: np.ndarray, u: np.ndarray, rel: float = 1e-12) -> bool:
    """Each slot's prefix-sum range [P(slot), P(slot + 1)) holds its u (within rounding of
    the total), and no slot is a zero leaf: the definition, by exact-ish cumulative sums."""
    prefix = np.concatenate([[0.0], np.cumsum(leaves, dtype=np.longdouble)]).astype(np.float64)
    tol = rel * prefix[-1]
    return bool((leaves[slots] > 0).all() and (prefix[slots] - tol <= u).all() and (u < prefix[slots + 1] + tol).all())


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), zeros=st.floats(0.0, 0.9), seed=st.integers(0, 10_000), k=st.integers(1, 300))
def test_fast_descent_finds_the_slot_whose_range_holds_u(n, zeros, seed, k):
    """find_prefix (a binary search over the top levels, then the plain descent) against
    the definition and against find_prefix_binary (one guarded level at a time), on
    pools with many zero leaves, trees of every depth (1 to 4096 leaves) and u anywhere
    in [0, total), the ends included."""
    rng = np.random.default_rng(seed)
    leaves = rng.exponential(1.0, n) * (rng.random(n) >= zeros)
    leaves[rng.integers(n)] = 1.0  # at least one entry holds priority
    tree = SegmentTree(n, np.add, 0.0)
    tree.rebuild(leaves)
    u = np.concatenate([[0.0, np.nextafter(tree.root, 0.0)], rng.random(k) * tree.root])
    fast, slow = tree.find_prefix(u), tree.find_prefix_binary(u)
    assert _prefix_holds(leaves, fast, u) and _prefix_holds(leaves, slow, u)
    assert (fast == slow).mean() > 0.99  # they may differ only where u sits on a boundary, by rounding


def test_fast_descent_redoes_a_u_that_rounding_carries_onto_a_zero_leaf(monkeypatch):
    """A tree whose nodes hold a hair more than their children (as rounding can leave
    them): slots 0..2998 hold 1, slot 2999 nothing, and the ancestors of the pair
    (2998, 2999) 1e-9 more than their children. The plain descent carries the largest u
    past slot 2998's range onto slot 2999, a zero leaf; that u is redone by the guarded
    descent, which keeps out of the empty subtree: slot 2998."""
    tree = SegmentTree(4096, np.add, 0.0)
    leaves = np.zeros(4096)
    leaves[:2999] = 1.0
    tree.rebuild(leaves)
    node = (4096 + 2998) // 2  # the pair's parent
    while node >= 1:
        tree.tree[node] += 1e-9
        node //= 2
    redone = []
    binary = tree.find_prefix_binary
    monkeypatch.setattr(tree, "find_prefix_binary", lambda u: redone.append(len(u)) or binary(u))
    u = np.array([0.5, tree.root - 1e-10])
    assert tree.find_prefix(u).tolist() == [0, 2998]
    assert redone == [1]  # only the carried u went the slow way


def _sharing_round(counts, updates, quota=5):
    spec = {"x": ((3,), torch.float32)}
    replicas = []
    for r, k in enumerate(counts):
        pool = PrioritizedReplay(100)
        pool.add({"x": torch.zeros(4, 3), "id": torch.arange(-4, 0)}, priorities=[1, 2, 3, 4])  # the common start
        sh = SharedReplay(pool, spec, rank=r, quota=quota, update_cap=8)
        sh.insert({"x": torch.full((k, 3), float(r))})
        sh.update(*updates[r])
        replicas.append(sh)
    n = len(counts)
    gens = [share(sh, sh.message_numel) for sh in replicas]
    run_programs(gens)
    return replicas


def test_a_sharing_round_loses_and_duplicates_nothing():
    counts = [3, 9, 0]  # rank 1 is over its quota of 5
    updates = [([0, 1], [7.0, 1.0]), ([1], [3.0]), ([2, 2], [0.5, 6.0])]
    replicas = _sharing_round(counts, updates)
    ref = replicas[0]
    for sh in replicas[1:]:  # identical replicas
        assert np.array_equal(sh.pool.priorities(), ref.pool.priorities())
        for k in ref.pool.columns:
            assert torch.equal(sh.pool.columns[k], ref.pool.columns[k])
    ids = ref.pool.columns["id"][:len(ref.pool)].tolist()
    sent = [0 * 2**40 + i for i in range(3)] + [1 * 2**40 + i for i in range(4, 9)]  # rank 1: its newest 5
    assert ids == [-4, -3, -2, -1] + sent and len(set(ids)) == len(ids)
    assert replicas[1].dropped == 4 and replicas[0].dropped == 0
    assert [sh.pending for sh in replicas] == [[], [], []]
    # updates in rank order: slot 1 -> rank 1's 3.0, slot 2 -> rank 2's last 6.0
    stored = ref.pool.priorities()
    assert np.allclose(stored[:4], (np.array([7.0, 3.0, 6.0, 4.0]) + 1e-6) ** 0.6)


def test_priorities_given_at_insertion_travel_with_the_rows():
    sh = [SharedReplay(PrioritizedReplay(10), {"x": ((3,), torch.float32)}, rank=r, quota=4, update_cap=2)
          for r in range(2)]
    sh[0].insert({"x": torch.ones(2, 3)}, priorities=[0.5, 2.0])
    sh[1].insert({"x": torch.zeros(1, 3)})  # no priority: the largest so far
    run_programs([share(s, s.message_numel) for s in sh])
    for s in sh:
        # rank 1's row comes after rank 0's: the largest so far is then rank 0's 2.0 (+ eps)
        assert np.allclose(s.pool.priorities(), [(0.5 + 1e-6) ** 0.6, (2.0 + 1e-6) ** 0.6, (2.0 + 1e-6) ** 0.6],
                           rtol=1e-12)


def test_sharing_state_resumes():
    a = SharedReplay(PrioritizedReplay(10), {"x": ((3,), torch.float32)}, rank=1, quota=4, update_cap=4)
    a.insert({"x": torch.ones(2, 3)})
    b = SharedReplay(PrioritizedReplay(10), {"x": ((3,), torch.float32)}, rank=1, quota=4, update_cap=4)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a.pack(), b.pack(), rtol=0, atol=0, equal_nan=True)  # NaN: "largest priority"


def test_apex_epsilons_by_role():
    eps = apex_epsilons(["validator", "explorer", "optimizer", "optimizer"])
    assert eps[1] == pytest.approx(0.4) and eps[0] == pytest.approx(0.4 ** 8)
    assert eps[1] > eps[2] > eps[3] > eps[0]
    assert apex_epsilons(["explorer"]) == [0.4]


# ---- the cooperative program on cartpole with the shared pool ---------------------------

from pathlib import Path  # noqa: E402

from oresearcher import ops as O  # noqa: E402
from oresearcher.errors import UserError  # noqa: E402
from oresearcher.programs import AgentContext, get_program  # noqa: E402
from oresearcher.scenario import load_scenario  # noqa: E402
from oresearcher.tasks import make_learner  # noqa: E402
from oresearcher.testing import tap  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE = ROOT / "scenarios" / "cartpole-4.yaml"
SHARED = ["training.steps=60", "communication.interval=30", "cooperation.replay.enabled=true",
          "cooperation.replay.sync_every=5", "cooperation.replay.quota=3"]


def _cartpole(sets, wrap=None):
    sc = load_scenario(CARTPOLE, sets)
    learners = [make_learner(sc, r, mode="numeric") for r in range(4)]
    gens = [get_program("oresearcher")(AgentContext(r, 4, sc, mode="numeric"), l) for r, l in enumerate(learners)]
    return run_programs([wrap(r, g) if wrap else g for r, g in enumerate(gens)]), learners


def test_cartpole_agents_share_one_pool():
    shares = []
    wrap = lambda r, g: tap(g, lambda op: shares.append(r) if isinstance(op, O.AllGather) and  # noqa: E731
                            op.name == "replay_share" else None)
    steps, learners = _cartpole(SHARED, wrap)
    pools = [l.shared_replay.pool for l in learners]
    for p in pools[1:]:  # after the last round every replica is the same
        assert torch.equal(p.columns["id"], pools[0].columns["id"])
        assert np.array_equal(p.priorities(), pools[0].priorities())
    ids = pools[0].columns["id"][:len(pools[0])]
    assert set((ids // 2**40).tolist()) == {0, 1, 2, 3} and len(set(ids.tolist())) == len(ids)
    # one env step per agent per step, 5 steps a round, a quota of 3: 2 dropped each round
    assert all(l.shared_replay.dropped > 0 for l in learners)
    assert len(pools[0]) == 4 * 3 * (shares.count(0))
    eps = [l.fixed_epsilon for l in learners]  # Ape-X by role: the explorer (rank 0) explores most
    assert eps[0] == pytest.approx(0.4) and min(eps) == pytest.approx(0.4 ** 8)
    assert all(per[-1].metrics["test_return"] >= 1 for per in steps)


def test_simulator_runs_the_shared_pool_as_the_reference_does():
    simulate = pytest.importorskip("oresearcher.sim.simulate").simulate
    ref, _ = _cartpole(SHARED)
    report, _ = simulate(load_scenario(CARTPOLE, SHARED))
    for r in range(4):
        assert report["metrics"][str(r)][-1]["test_return"] == ref[r][-1].metrics["test_return"]
    assert "replay_share" in {b["name"] for b in report["breakdown"]}


@pytest.mark.parametrize("path, override, message", [
    (ROOT / "scenarios" / "8xA100.yaml", ["cooperation.replay.enabled=true"], "cartpole transitions or digits"),
    (ROOT / "scenarios" / "digits-4.yaml", ["cooperation.replay.enabled=true", "cooperation.privacy.enabled=true",
                                            "cooperation.privacy.noise_multiplier=1"], "accounting would not hold"),
    (CARTPOLE, ["cooperation.replay.enabled=true", "training.strategy=ddp"], "training.strategy: oresearcher"),
    (CARTPOLE, ["cooperation.replay.quota=0"], r"cooperation\.replay\.quota"),
    (CARTPOLE, ["cooperation.replay.beta_start=1.5"], r"cooperation\.replay\.beta_start"),
])
def test_replay_fields_are_validated(path, override, message):
    with pytest.raises(UserError, match=message):
        load_scenario(path, override)


def test_digits_agents_share_a_hard_example_pool():
    sets = ["training.steps=24", "communication.interval=12", "cooperation.replay.enabled=true",
            "cooperation.replay.sync_every=4"]
    sc = load_scenario(ROOT / "scenarios" / "digits-4.yaml", sets)
    learners = [make_learner(sc, r, mode="numeric") for r in range(4)]
    steps = run_programs([get_program("oresearcher")(AgentContext(r, 4, sc, mode="numeric"), l)
                          for r, l in enumerate(learners)])
    pools = [l.shared_replay.pool for l in learners]
    for p in pools[1:]:
        assert np.array_equal(p.priorities(), pools[0].priorities())
    n = len(pools[0])
    assert n > 0 and len(set(pools[0].columns["id"][:n].tolist())) == n
    # priorities are the samples' losses (new rows join at their loss, not at the maximum)
    assert len(np.unique(pools[0].priorities())) > n // 2
    # a quarter of a batch (4 of 16) came from the pool once it held enough
    assert all(l.batches.last[3] is not None and len(l.batches.last[3]) == 4 for l in learners)
    x, y = pools[0].columns["x"][:n], pools[0].columns["y"][:n]
    X, Y = learners[0].batches.inner.X, learners[0].batches.inner.y  # rows are real training samples
    match = (x.unsqueeze(1) == X.unsqueeze(0)).all(-1)
    assert bool(match.any(1).all()) and bool((Y[match.float().argmax(1)] == y).all())
    assert all(0.0 <= per[-1].metrics["test_accuracy"] <= 1.0 for per in steps)
