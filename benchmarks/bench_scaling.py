"""Scaling laws of each strategy on real text: a size ladder, the laws fitted to it, and a
held-out size predicted by them.

    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py --check      # the committed ladder: fits, held-out check
    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py --run        # train what the ladder lacks, then --check
    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py --run --strategies ddp,diloco-h10,ddp-int8 &  # two processes may share the file
    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py --run --strategies diloco-h50,cooperative
    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py --run --sizes text-25k,text-50k --steps 30 \\
        --results /tmp/ladder.json                                     # a quick look (what the tests run)

The ladder (docs/scaling.md): the text task's GPT family at ``--sizes`` (non-embedding
parameters N), each trained from scratch on the State of the Union addresses for
``--tpp`` tokens per parameter (D = tpp x N), 4 agents, a global batch of 8 windows of 128
tokens, AdamW with the pretraining recipe's schedule (10% linear warm-up, cosine to 10%;
``workload.options.lr_schedule: cosine``), in the simulator's numeric mode: the project's
own programs, each strategy as a scenario sets it. The learning rate is tuned per size for
data parallel (:func:`tune`) and reused by every other strategy. Data parallel also runs at
a half and a quarter of the budget, so Chinchilla's L(N, D) sees three D per N. Each run records its mean
training loss per step (every agent's next batch is unseen text: the ladder stays under one
epoch) and the validation loss of its deployable model on 128 windows of held-out documents
(nats/token).

Every run is keyed by the hash of its scenario and :data:`METHOD`; ``--results`` (committed:
``benchmarks/results/scaling-ladder.json``) holds each finished run under its key with the
command, commit and host that made it, written after each run, so an interrupted ladder
resumes and ``--check`` trains nothing. The fits are :mod:`oresearcher.models.scaling_laws`;
``--check`` prints them with bootstrap intervals and residuals, and writes them beside the
results (``scaling-fits.json``) with a figure (``--figure``).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from oresearcher.models import convergence as cv
from oresearcher.files import read_json, write_text
from oresearcher.scenario import validate
from oresearcher.tasks.text.pretrain import lr_at

METHOD = "ladder-v1"  # bump when what a stored run means changes
SIZES = ("text-6k", "text-12k", "text-25k", "text-50k", "text-100k", "text-230k", "text-450k")
# the held-out check (scaling_report.split): text-450k from the 5 sizes up to text-100k (4.5x past
# them); text-230k, 4.7x past the 4 up to text-50k, is a second, smaller one
# strategy -> scenario overrides (dotted path -> value); the cooperative program with its defaults
STRATEGIES = {
    "ddp": {"training.strategy": "ddp"},
    "diloco-h10": {"training.strategy": "diloco", "training.local_steps": 10},
    "diloco-h50": {"training.strategy": "diloco", "training.local_steps": 50},
    "ddp-int8": {"training.strategy": "ddp", "communication.codec": "int8"},
    "cooperative": {"training.strategy": "oresearcher"},
}
AGENTS, BATCH, SEQ = 4, 8, 128  # agents, global batch (windows), tokens per window
SHORTER = (0.5, 0.25)  # data parallel's other budgets, a fraction of the size's: Chinchilla's D at each N
LR_START = 6e-3  # the smallest size's first rate; each larger size starts from the one before's best
RESULTS = Path("benchmarks/results/scaling-ladder.json")


def non_embedding(name: str) -> int:
    """Non-embedding parameters of a text preset (Kaplan et al. 2020's N)."""
    from oresearcher.models import n_non_embedding

    return n_non_embedding(name)


def budget_steps(name: str, tpp: float) -> int:
    """Steps of ``BATCH x SEQ`` tokens that make ``tpp`` tokens per non-embedding parameter."""
    return max(1, math.ceil(tpp * non_embedding(name) / (BATCH * SEQ)))


def scenario_data(name: str, strategy: str, lr: float, steps: int, seed: int) -> dict:
    """The raw scenario of one ladder run."""
    data = {
        "name": f"{name}.{strategy}", "seed": seed,
        "cluster": {"nodes": 1, "gpus_per_node": AGENTS, "device": "cpu-local", "intra_node": "loopback"},
        "workload": {"task": "text", "model": name, "global_batch": BATCH, "seq_len": SEQ, "dtype": "fp32",
                     "optimizer": "adamw",
                     "options": {"corpus": "sotu", "init": "none", "dropout": [0.0, 0.0], "lr_schedule": "cosine",
                                 "eval_tokens": 128 * SEQ, "mc_questions": 1}},
        "agents": {"count": AGENTS},
        "training": {"strategy": "ddp", "steps": steps, "lr": lr},
        "simulation": {"mode": "numeric"},
    }
    for path, value in STRATEGIES[strategy].items():
        node = data
        *head, last = path.split(".")
        for key in head:
            node = node.setdefault(key, {})
        node[last] = value
    return data


def run_key(data: dict) -> str:
    blob = json.dumps({"scenario": data, "method": METHOD, "torch": torch.__version__.split("+")[0]},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def strategy_of(data: dict) -> str:
    return data["name"].split(".", 1)[1]


def train(data: dict) -> dict:
    """One ladder run in numeric mode: its curve, validation loss and cost."""
    from oresearcher.sim.simulate import simulate

    sc = validate(data, "bench_scaling")
    t0, c0 = time.perf_counter(), time.process_time()
    report, _ = simulate(sc, mode="numeric")
    curve = cv.mean_curve(report["metrics"])
    final = report["final"]
    agents = [a["value"] for a in final["agents"] if a["value"] is not None]
    deploy = final["deployable"]  # the cooperative program's fused model is every agent's at the end
    val = deploy["value"] if deploy["value"] is not None else sum(agents) / len(agents)
    return {"model": data["workload"]["model"], "strategy": strategy_of(data),
            "lr": data["training"]["lr"], "steps": data["training"]["steps"], "seed": data["seed"],
            "tokens_per_step": BATCH * SEQ, "n": non_embedding(data["workload"]["model"]),
            "val_loss": float(val), "deployable": deploy["what"], "agents_val_loss": agents,
            "curve": [round(v, 5) for v in curve], "seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(time.process_time() - c0, 1), "scenario": data}


def provenance(command: str) -> dict:
    try:
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout.strip()  # noqa
        commit = git("rev-parse", "HEAD") + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"command": command, "commit": commit, "host": platform.node(), "cpu": platform.processor() or
            platform.machine(), "torch": torch.__version__, "threads": torch.get_num_threads(), "method": METHOD}


class Ladder:
    """The results file: runs by key, rewritten whole after each new run."""

    def __init__(self, path: Path, command: str):
        self.path = path
        self.runs: dict = {}
        self.command = command
        self.merge()

    def get(self, data: dict, log=print) -> dict:
        key = run_key(data)
        if key not in self.runs:
            self.merge()  # another process on the same file may have trained it
        if key not in self.runs:
            log(f"  training {data['workload']['model']} {strategy_of(data)} seed {data['seed']} lr "
                f"{data['training']['lr']:g} {data['training']['steps']} steps ...", flush=True)
            self.runs[key] = train(data)
            self.save()
            r = self.runs[key]
            log(f"    validation loss {r['val_loss']:.4f} in {r['seconds']:.0f} s ({r['cpu_seconds']:.0f} s CPU)",
                flush=True)
        return self.runs[key]

    def merge(self) -> None:
        """Take the runs another process wrote since this one last read the file."""
        if self.path.is_file():
            self.runs = {**read_json(self.path).get("runs", {}), **self.runs}

    def save(self) -> None:
        """Rewrite the file with this process's runs and every run already in it, under an
        exclusive lock: processes training different strategies may share one file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            old = read_json(self.path) if self.path.is_file() else {}
            self.runs = {**old.get("runs", {}), **self.runs}
            made_by = list(old.get("made_by", []))
            mine = provenance(self.command)
            if not any(m["command"] == mine["command"] and m["commit"] == mine["commit"] for m in made_by):
                made_by.append(mine)
            write_text(self.path, json.dumps({"method": METHOD, "made_by": made_by, "runs": self.runs},
                                             indent=1, sort_keys=True) + "\n")


def tune(ladder: Ladder, name: str, start: float, steps: int, seed: int) -> float:
    """Data parallel's rate for size ``name``: from ``start`` (the previous size's best) halve
    while the validation loss falls; if the first halving does not help, double instead
    while it falls. A grid in factors of 2, walked from where the last size ended."""
    def loss(lr):
        return ladder.get(scenario_data(name, "ddp", lr, steps, seed))["val_loss"]

    best, best_loss = start, loss(start)
    for factor in (0.5, 2.0):
        moved = False
        while True:
            lr = best * factor
            v = loss(lr)
            if not v < best_loss:
                break
            best, best_loss, moved = lr, v, True
        if moved:
            break
    return best


def run_ladder(args, ladder: Ladder) -> None:
    """Tune data parallel size by size, then every strategy at the tuned rates, seed by seed
    (priority order: a ladder cut short has whole strategies)."""
    lrs, start = {}, args.lr_start
    for name in args.sizes:
        steps = args.steps or budget_steps(name, args.tpp)
        lrs[name] = start = tune(ladder, name, start, steps, args.seed)
        print(f"{name}: data parallel's rate {start:g}", flush=True)
    for strategy in args.strategies:
        for seed in range(args.seed, args.seed + args.seeds):
            for name in args.sizes:
                steps = args.steps or budget_steps(name, args.tpp)
                ladder.get(scenario_data(name, strategy, lrs[name], steps, seed))
                if strategy == "ddp" and seed == args.seed and args.half and not args.steps:
                    for part in SHORTER:
                        ladder.get(scenario_data(name, "ddp", lrs[name], budget_steps(name, args.tpp * part), seed))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--run", action="store_true", help="train the runs the results lack, then check")
    p.add_argument("--check", action="store_true", help="fit and check the stored results (no training)")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--sizes", type=lambda s: tuple(s.split(",")), default=SIZES)
    p.add_argument("--strategies", type=lambda s: tuple(s.split(",")), default=tuple(STRATEGIES))
    p.add_argument("--tpp", type=float, default=20.0, help="tokens per non-embedding parameter")
    p.add_argument("--half", action=argparse.BooleanOptionalAction, default=True,
                   help="data parallel also at a half and a quarter of the budget (Chinchilla's other D)")
    p.add_argument("--steps", type=int, default=0, help="steps per run instead of the budget (quick looks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=3,
                   help="seeds of every size (the fits and the held-out check take their median)")
    p.add_argument("--lr-start", type=float, default=LR_START)
    p.add_argument("--figure", type=Path, default=None, help="write the fits' figure here")
    args = p.parse_args(argv)
    from oresearcher.tasks.text import MODELS

    bad = [s for s in args.strategies if s not in STRATEGIES] + [s for s in args.sizes if s not in MODELS]
    if bad:
        print(f"error: unknown strategy or size {bad[0]} (strategies {', '.join(STRATEGIES)}; sizes "
              f"{', '.join(MODELS)})", file=sys.stderr)
        return 2
    command = "OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.run:
        run_ladder(args, Ladder(args.results, command))
    from scaling_report import check  # the reading half, beside this file

    from oresearcher.models.ladder_law import SHIPPED

    return check(args.results, args.figure, SHIPPED if args.results == RESULTS else None)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
