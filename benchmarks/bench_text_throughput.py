"""The framework's overhead on the text task: the project's training step beside a bare
PyTorch loop training the same model on the same batches.

    OMP_NUM_THREADS=1 python benchmarks/bench_text_throughput.py [--model text-100k] [--steps 30] [--repeats 3]

The project's side is what ``python -m oresearcher.run`` executes on one rank: the ``single``
program (:mod:`oresearcher.programs.data_parallel`) yields its ops, the real backend's
interpreter (:class:`oresearcher.backends.run.interpreter.Interpreter`) runs and times them, and
the text learner (:mod:`oresearcher.tasks.text.learner`) does the work: batch from the
memory-mapped corpus, forward, backward, AdamW step. The bare side is the loop a nanoGPT
user writes: the same model (same initialisation), the same AdamW, the same batch stream
(same seed and rank, so the same windows), ``zero_grad``, loss, backward, step, ``loss.item()``.

Both run alternately ``--repeats`` times (a shared machine drifts); each side's figure is the
median wall time of a step after ``--warmup`` steps, tokens per second from it, and the
overhead is project / bare - 1 (target under 10%). The step excludes the evaluation the
program runs after its last step. Dropout is off on both sides (the agents' heterogeneous
dropout would otherwise make the two models differ), the corpus is the Bible at the
scenario's vocabulary, prepared once in the user's text cache.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.10


def scenario(model: str, steps: int, batch: int):
    from oresearcher.scenario import load_scenario

    return load_scenario(ROOT / "scenarios" / "text-4.yaml", [
        f"workload.model={model}", f"workload.global_batch={batch}", "training.strategy=single",
        "agents.count=1", "cluster.gpus_per_node=1", "agents.roles=null", f"training.steps={steps}",
        "workload.options.init=none", "workload.options.dropout=[0.0, 0.0]", "distill.student=null",
        "training.eval_every=0"])


def project_steps(sc) -> list[float]:
    """Wall seconds of each step of the single program run by the real backend's interpreter."""
    from oresearcher.backends.run.interpreter import Interpreter
    from oresearcher.programs import AgentContext, get_program
    from oresearcher.reporting.report import Timeline
    from oresearcher.tasks import make_learner

    learner = make_learner(sc, 0, mode="real")
    learner.evaluate = lambda: {}  # the step only: the program's final evaluation is not training
    ends = [time.perf_counter()]
    interp = Interpreter(0, 1, device=torch.device("cpu"), timeline=Timeline(1, keep_spans=0),
                         clock=time.perf_counter, on_step=lambda *a: ends.append(time.perf_counter()))
    ctx = AgentContext(rank=0, world_size=1, scenario=sc, mode="real")
    interp.run(get_program("single")(ctx, learner))
    return [b - a for a, b in zip(ends, ends[1:])]


def bare_steps(sc) -> list[float]:
    """Wall seconds of each step of the plain loop (module doc)."""
    from oresearcher.models import lm_loss
    from oresearcher.seeds import derive, name_salt
    from oresearcher.tasks.text.data import batches, prepare
    from oresearcher.tasks.text.model import build_model

    w, o = sc.workload, sc.workload.options
    torch.manual_seed(derive(sc.seed, name_salt(w.model)))  # the learner's initialisation
    model = build_model(w.model, o.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=sc.training.lr, betas=(0.9, 0.95))
    data = prepare(o.corpus, "train", o.vocab_size, o.cache_dir, o.tokenizer_corpus)
    stream = batches(data, w.global_batch, w.seq_len, seed=sc.seed, rank=0)
    model.train()
    out = []
    for _ in range(sc.training.steps):
        t0 = time.perf_counter()
        x = next(stream)
        loss = lm_loss(model(x[:, :-1]), x[:, 1:])
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        loss.item()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="text-100k")
    ap.add_argument("--steps", type=int, default=30, help="steps per run (the first --warmup not timed)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8, help="windows of 128 tokens per step")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    sc = scenario(args.model, args.steps, args.batch)
    runs = {"project": [], "bare": []}
    for _ in range(args.repeats):  # alternate, so drift on a shared host hits both
        runs["project"] += project_steps(sc)[args.warmup:]
        runs["bare"] += bare_steps(sc)[args.warmup:]
    tokens = args.batch * sc.workload.seq_len
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"text throughput: {args.model}, {args.batch} x {sc.workload.seq_len} tokens a step, "
          f"{torch.get_num_threads()} thread(s), median of {len(runs['bare'])} steps a side")
    for k in ("project", "bare"):
        print(f"  {k:<8} {med[k] * 1e3:8.2f} ms/step  {tokens / med[k]:10,.0f} tokens/s")
    over = med["project"] / med["bare"] - 1
    print(f"  overhead {over:+.1%} (target < {TARGET:.0%}): {'within' if over < TARGET else 'OVER'} target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
