"""cartpole: gymnasium's CartPole-v1 with DQN agents (Mnih et al., Nature 2015).

One training step of an agent ("forward_backward" in the Learner interface) first
collects ``ENV_STEPS_PER_STEP / agents.count`` environment steps epsilon-greedily into
the agent's own replay buffer (the shared replay pool has its own issue), then computes
the TD loss's gradient on a replay batch of ``global_batch / agents.count`` transitions
with a target network refreshed every ``TARGET_EVERY`` updates. So a group of n agents
collects and replays as many transitions per step, all together, as a single agent:
equal compute means equal samples. Flat parameters and gradients are the Q-network's,
so every program (ddp, diloco, cooperative) works on them unchanged.

Reward: the environment's +1 per step unless the cooperative program sets reward
weights (``set_reward_weights``); then each stored transition carries
``w_base * 1 + w_novelty * count_novelty(state) + w_safety * [|x| <= 1.2]`` (the
multi-objective reward of :mod:`oresearcher.tasks.rewards` as the return the agent optimises).

Shared prioritized replay (``cooperation.replay``, :mod:`oresearcher.cooperation.replay_sharing`): the
program hands the learner a replica of the group's pool (``use_shared_replay``); collected
transitions are queued for it, a step samples from it (once it holds a batch; the own
buffer before that) with importance weights on the TD loss, and the batch's |TD errors|
become the sampled rows' new priorities. With Ape-X exploration the program fixes each
agent's epsilon by role (``set_fixed_epsilon``).

Models: ``mlp`` (4 -> 64 -> 64 -> 2) and ``mlp-small`` (4 -> 32 -> 2). Test metric: mean
greedy return over 5 fixed-seed episodes (max 500). Validators score on 3 other seeds.
"""
from __future__ import annotations


import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
from . import agent_model
from ..models.learner import TorchLearner
from .rewards import centre_band_safety, count_novelty
from .spec import Task
from ..models.workloads import measure_module
from ..seeds import derive, name_salt

MODELS = ("mlp", "mlp-small")
MAX_RETURN = 500.0
GAMMA = 0.99
ENV_STEPS_PER_STEP = 4  # transitions collected per training step by the whole group
TARGET_EVERY = 50
BUFFER = 20_000
EPS_START, EPS_END, EPS_FRACTION = 1.0, 0.05, 0.4
TEST_SEEDS = tuple(range(10_000, 10_005))
VAL_SEEDS = tuple(range(20_000, 20_003))
SAFE_BAND = 1.2
_BIN_EDGES = [torch.linspace(-2.4, 2.4, 7), torch.linspace(-3, 3, 7), torch.linspace(-0.21, 0.21, 7),
              torch.linspace(-3.5, 3.5, 7)]


def build_qnet(name: str) -> nn.Module:
    if name == "mlp":
        return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    if name == "mlp-small":
        return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    raise UserError(f"workload.model: cartpole has models {', '.join(MODELS)} (got {name!r})")


def state_bin(s: torch.Tensor) -> int:
    """Index of a coarse 8^4 grid cell of a state, for count-based novelty."""
    idx = 0
    for k, edges in enumerate(_BIN_EDGES):
        idx = idx * 8 + int(torch.bucketize(s[k], edges))
    return idx


class Replay:
    """Ring buffer of (s, a, r, s', terminated)."""

    def __init__(self, capacity: int):
        self.s = torch.zeros(capacity, 4)
        self.a = torch.zeros(capacity, dtype=torch.int64)
        self.r = torch.zeros(capacity)
        self.s2 = torch.zeros(capacity, 4)
        self.d = torch.zeros(capacity)
        self.cap, self.n, self.i = capacity, 0, 0

    def add(self, s, a, r, s2, d) -> None:
        self.s[self.i], self.a[self.i], self.r[self.i], self.s2[self.i], self.d[self.i] = s, a, r, s2, d
        self.i = (self.i + 1) % self.cap
        self.n = min(self.n + 1, self.cap)

    def sample(self, batch: int, g: torch.Generator):
        idx = torch.randint(self.n, (batch,), generator=g)
        return self.s[idx], self.a[idx], self.r[idx], self.s2[idx], self.d[idx]


def greedy_episode(qnet: nn.Module, seed: int):
    """One greedy episode: (return, visited cart positions, Q(s0, a0))."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    total, xs, q0, done = 0.0, [], None, False
    with torch.no_grad():
        while not done:
            q = qnet(torch.as_tensor(obs).unsqueeze(0))[0]
            q0 = float(q.max()) if q0 is None else q0
            obs, r, term, trunc, _ = env.step(int(q.argmax()))
            total += r
            xs.append(float(obs[0]))
            done = term or trunc
    env.close()
    return total, torch.tensor(xs), q0


class DQNStream:
    """The learner's batch iterator: each ``next`` acts in the env, then samples replay."""

    def __init__(self, learner: "CartPoleLearner", seed: int, env_steps: int, batch: int, total_steps: int):
        self.l, self.env_steps, self.batch = learner, env_steps, batch
        self.env = gym.make("CartPole-v1")
        self.obs, _ = self.env.reset(seed=seed)
        self.g = torch.Generator().manual_seed(seed)
        self.replay = Replay(BUFFER)
        self.counts: dict[int, int] = {}
        self.collected, self.updates = 0, 0
        self.decay_steps = max(1, int(EPS_FRACTION * total_steps * env_steps))
        self.episode_return, self.returns = 0.0, []

    def epsilon(self) -> float:
        if self.l.fixed_epsilon is not None:  # Ape-X: one epsilon per agent, set by the program
            return self.l.fixed_epsilon
        frac = min(1.0, self.collected / self.decay_steps)
        return min(1.0, (EPS_START + frac * (EPS_END - EPS_START)) * self.l.exploration_scale)

    def _act(self, s: torch.Tensor) -> int:
        if float(torch.rand((), generator=self.g)) < self.epsilon():
            return int(torch.randint(2, (), generator=self.g))
        with torch.no_grad():
            return int(self.l.module(s.unsqueeze(0).to(self.l.dtype)).argmax())

    def _shaped(self, s2: torch.Tensor, env_reward: float) -> float:
        w = self.l.reward_weights
        if w is None:
            return env_reward
        b = state_bin(s2)
        self.counts[b] = self.counts.get(b, 0) + 1
        nov = float(count_novelty(torch.tensor(self.counts[b] - 1)))
        return w[0] * env_reward + w[1] * nov + w[2] * float(abs(float(s2[0])) <= SAFE_BAND)

    def collect(self, n: int) -> None:
        start = self.replay.i
        for _ in range(n):
            s = torch.as_tensor(self.obs)
            a = self._act(s)
            self.obs, r, term, trunc, _ = self.env.step(a)
            s2 = torch.as_tensor(self.obs)
            self.replay.add(s, a, self._shaped(s2, float(r)), s2, float(term))
            self.collected += 1
            self.episode_return += r
            if term or trunc:
                self.returns.append(self.episode_return)
                self.episode_return = 0.0
                self.obs, _ = self.env.reset(seed=int(torch.randint(2**31 - 1, (), generator=self.g)))
        if self.l.shared_replay is not None and n > 0:  # the same rows, queued for the group's pool
            idx = (start + torch.arange(n)) % self.replay.cap
            r = self.replay
            self.l.shared_replay.insert({"s": r.s[idx], "a": r.a[idx], "r": r.r[idx], "s2": r.s2[idx], "d": r.d[idx]})

    def __iter__(self):
        return self

    def __next__(self):
        self.collect(self.env_steps)
        if self.replay.n < self.batch:
            self.collect(self.batch - self.replay.n)
        if self.updates % TARGET_EVERY == 0:
            self.l.target.load_state_dict(self.l.module.state_dict())
        self.updates += 1
        shared = self.l.shared_replay
        if shared is not None and len(shared.pool) >= self.batch:
            slots, rows, w = shared.pool.sample(self.batch, self.g, step=self.updates - 1)
            return rows["s"], rows["a"], rows["r"], rows["s2"], rows["d"], w, slots
        return self.replay.sample(self.batch, self.g)


class CartPoleLearner(TorchLearner):
    metric_name = "return"
    # one transition, as the shared replay pool stores it: {column: (shape, dtype)}
    replay_spec = {"s": ((4,), torch.float32), "a": ((), torch.int64), "r": ((), torch.float32),
                   "s2": ((4,), torch.float32), "d": ((), torch.float32)}

    def __init__(self, arch: str, seed: int, rank: int, batch: int, env_steps: int, total_steps: int,
                 lr: float, optimizer: str, bucket_bytes: int):
        torch.manual_seed(derive(seed, name_salt(arch)))
        module = build_qnet(arch)
        self.target = build_qnet(arch)
        self.arch, self.exploration_scale, self.reward_weights = arch, 1.0, None
        self.shared_replay, self.fixed_epsilon, self._sampled = None, None, None
        opt = (torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0) if optimizer == "adamw"
               else torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9))
        s = torch.zeros(batch, 4)
        fwd, bwd, _ = measure_module(module, (s,), lambda q: q.sum())
        self.act_flops = float(measure_module(module, (s[:1],), lambda q: q.sum())[0])
        stream = DQNStream(self, derive(seed, rank, prime=1000), env_steps, batch, total_steps)
        # a step: env_steps acting forwards, the online and the target forward on the batch
        super().__init__(module, opt, stream, self._td_loss, fwd_flops=2 * fwd + env_steps * self.act_flops,
                         bwd_flops=bwd, bucket_bytes=bucket_bytes)
        self._scratch: dict[str, nn.Module] = {}
        self._probe = self._probe_transitions()

    def _td_loss(self, module, batch):
        s, a, r, s2, d = batch[:5]
        q = module(s).gather(1, a.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            target = r + GAMMA * (1.0 - d) * self.target(s2).max(1).values
        if len(batch) == 5:
            self._sampled = None
            return F.smooth_l1_loss(q, target)
        w, slots = batch[5:]  # from the shared prioritized pool: importance-weighted
        self._sampled = (slots, (q - target).detach().abs())
        return (w * F.smooth_l1_loss(q, target, reduction="none")).mean()

    def use_shared_replay(self, shared) -> None:
        """Queue collected transitions for ``shared`` (a SharedReplay) and sample from it."""
        self.shared_replay = shared

    def set_fixed_epsilon(self, eps) -> None:
        self.fixed_epsilon = None if eps is None else float(eps)

    @staticmethod
    def _probe_transitions(n: int = 256):
        """Fixed random-policy transitions every validator scores on (seeded)."""
        env, g = gym.make("CartPole-v1"), torch.Generator().manual_seed(777)
        obs, _ = env.reset(seed=777)
        rows = []
        for _ in range(n):
            a = int(torch.randint(2, (), generator=g))
            obs2, r, term, trunc, _ = env.step(a)
            rows.append((torch.as_tensor(obs), a, float(r), torch.as_tensor(obs2), float(term)))
            obs = env.reset(seed=int(torch.randint(10**6, (), generator=g)))[0] if term or trunc else obs2
        s, a, r, s2, d = zip(*rows)
        return torch.stack(s), torch.tensor(a), torch.tensor(r), torch.stack(s2), torch.tensor(d)

    def set_exploration(self, scale: float) -> None:
        self.exploration_scale = float(scale)

    def set_reward_weights(self, weights) -> None:
        self.reward_weights = None if weights is None else tuple(float(w) for w in weights)

    def forward_backward(self) -> dict:
        out = super().forward_backward()
        if self._sampled is not None:  # the batch's |TD errors| are its rows' new priorities
            self.shared_replay.update(self._sampled[0], self._sampled[1].numpy())
        if self.batches.returns:
            out["train_return"] = float(sum(self.batches.returns[-10:]) / len(self.batches.returns[-10:]))
        return out

    def arch_numel(self, arch: str) -> int:
        return sum(p.numel() for p in self._module_for(arch).parameters())

    def _module_for(self, arch: str) -> nn.Module:
        if arch not in self._scratch:
            self._scratch[arch] = build_qnet(arch)
        return self._scratch[arch]

    def evaluate(self) -> dict:
        self.module.eval()
        ret = sum(greedy_episode(self.module, s)[0] for s in TEST_SEEDS) / len(TEST_SEEDS)
        return {"test_return": ret, "metric": ret}

    def evaluate_params(self, flat: torch.Tensor, arch: str) -> dict:
        """Validator's view of one agent: greedy return on the validation seeds (metric,
        normalised to [0, 1]), Bellman error on the probe transitions (loss), Q-value
        calibration |Q(s0) - G0| (1 - gamma), centre-band safety, Boltzmann policy on the
        probe states (probs, for novelty) and the FLOPs it took."""
        q = self._module_for(arch)
        torch.nn.utils.vector_to_parameters(flat[: self.arch_numel(arch)].float(), q.parameters())
        s, a, r, s2, d = self._probe
        with torch.no_grad():
            qs, qs2 = q(s), q(s2)
        if not (torch.isfinite(qs).all() and torch.isfinite(qs2).all()):
            nan = float("nan")
            return {"metric": nan, "loss": nan, "calibration": nan, "safety": 0.0,
                    "probs": torch.full((len(s), 2), 0.5), "flops": 2 * len(s) * self.act_flops}
        td = qs.gather(1, a.unsqueeze(1)).squeeze(1) - (r + GAMMA * (1 - d) * qs2.max(1).values)
        rets, xs, calib, steps = [], [], [], 0
        for seed in VAL_SEEDS:
            ret, pos, q0 = greedy_episode(q, seed)
            g0 = (1 - GAMMA ** ret) / (1 - GAMMA)  # discounted return of +1 rewards
            rets.append(ret), xs.append(pos), calib.append(abs(q0 - g0) * (1 - GAMMA))
            steps += int(ret)
        return {
            "metric": sum(rets) / len(rets) / MAX_RETURN,
            "loss": float(F.smooth_l1_loss(td, torch.zeros_like(td))),
            "calibration": sum(calib) / len(calib),
            "safety": centre_band_safety(torch.cat(xs), SAFE_BAND),
            "probs": qs.softmax(-1),
            "flops": (2 * len(s) + steps) * self.act_flops,
        }


def make_learner(scenario, rank: int, *, mode: str, device="cpu") -> CartPoleLearner:
    arch, batch = agent_model(scenario, rank, mode, MODELS)
    if torch.device(device).type != "cpu":
        raise UserError("workload.task=cartpole runs on CPU only (its environment steps are on the host)")
    w, n = scenario.workload, scenario.world_size
    return CartPoleLearner(arch, scenario.seed, rank, batch, max(1, ENV_STEPS_PER_STEP // n),
                           scenario.training.steps, scenario.training.lr, w.optimizer,
                           scenario.communication.bucket_bytes)


TASK = Task(name="cartpole", make_learner=make_learner, models=MODELS, replay="transitions",
            private_data="cartpole's replayed transitions are not a fixed private dataset; privacy runs on "
                         "supervised tasks")
