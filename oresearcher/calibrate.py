"""Measure this machine and write a hardware profile the simulator loads.

    python -m oresearcher.calibrate --backend=gloo          # writes runs/local-gloo/profile.yaml
    python -m oresearcher.calibrate --backend=gloo --scenario scenarios/local-gloo.yaml --num_agents=4 \\
        --out profiles/gloo-4.yaml

It starts the scenario's ranks (or joins torchrun's), times collectives over a size
sweep and a few steps of the scenario's own program with all ranks busy at once, and
writes two profiles (YAML documents; default ``runs/<scenario name>/profile.yaml``): a ``device`` (achieved FLOP/s per rank, host
overhead per op) and a ``fabric`` (latencies and bandwidth); for language-model
scenarios a third, ``<device>-roofline``, holds the roofline model's measured rates
(matmul, attention, memory bandwidth, launch cost; ``sim/roofline.py``). Use them from a scenario
with::

    cluster:
      profile_files: [profile.yaml]
      device: cpu-calibrated
      intra_node: gloo-calibrated

The fabric parameters are a least-squares fit of the simulator's ring cost model
(Thakur, Rabenseifner & Gropp 2005) to the measured times, on relative errors::

    t(kind, S, n) = call + base + hops(kind, n) * hop + bytes(kind, n) * S / bandwidth
    all-reduce: hops 2(n-1), bytes 2(n-1)/n;  all-gather (S = gathered total): n-1, (n-1)/n

Measuring two kinds with different hop counts separates the per-collective and per-hop
latencies at a single world size. Besides the sweep, the all-reduce is timed at the
workload's own sizes (its gradient buckets, its flat parameters), so the fit is anchored
where the scenario communicates.

The idle sweep fixes the shape of that line; its level is then scaled by one factor to
the program's own collectives timed during a short run with every rank busy
(:func:`inrun_factor`): on a shared CPU host those are slower than idle ones.
``--no-in-run`` keeps the idle fit.

The device's ``compute_jitter_cv`` is the per-step spread of compute time that ranks do
not share (:func:`own_slowness`: ranks slowed together wait for no one), pooled over
ranks, converted to the per-op cv that gives a simulated step that spread
(:func:`op_jitter_cv`); with it the simulator's ranks drift apart and wait for each
other at collectives as real ones do, and the device rate is the mean rank's (the
slowest rank's pace then emerges). ``--no-jitter`` keeps identical steady ranks at the
slowest rank's rate.

Slowness on a shared host persists for a few steps. Where the program averages every K
steps (local_sgd, diloco: K = local_steps; the cooperative program: its gradient-sharing
or fusion period), the ranks' drift over K steps is what they wait for, so calibration
also measures the persistence: ``compute_jitter_rho`` is the lag-1 correlation of the
AR(1) whose K-step variance ratio equals the measured one (:func:`persistence_rho`).
With it the simulator draws one factor per step (``compute_jitter_cv`` is then the
step's spread itself).

The device rate is the FLOPs the program's Compute ops declare divided by the time
they took: work the FLOP counts miss (optimizer steps, packing, a codec's elementwise
passes) is folded into the rate, so the profile fits the strategy it was measured
with. Calibrate with the scenario (strategy, codec, world size) you will predict. Calibrate at the world size you will run: ranks that
share cores are slower, and the profile records that.
"""
from __future__ import annotations

import argparse
import math
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from .errors import UserError
from .wire import ring_terms
from .scenario import load_raw, load_scenario
from .scenario_files import find_scenario

log = logging.getLogger("oresearcher.calibrate")

GB = 10**9
US = 1e-6
MAX_BANDWIDTH_GBps = 1e4  # when the fit finds no bandwidth term at all




@dataclass
class FabricFit:
    call_overhead_s: float
    base_latency_s: float
    hop_latency_s: float
    bandwidth_Bps: float

    def predict(self, kind: str, nbytes: float, n: int) -> float:
        hops, factor = ring_terms(kind, n)
        return self.call_overhead_s + self.base_latency_s + hops * self.hop_latency_s + factor * nbytes / self.bandwidth_Bps


WORKLOAD_WEIGHT = 5.0  # rows timed at the scenario's own sizes count this many times


def fit_fabric(rows, n: int, call_overhead_s: float = 0.0) -> FabricFit:
    """Fit the ring model to rows {kind, bytes, time_s[, workload]} measured on ``n`` ranks.

    Least squares on relative errors, every parameter kept >= 0; rows measured at the
    workload's own sizes weigh ``WORKLOAD_WEIGHT`` times more, so the line passes
    closest where the scenario communicates. ``call_overhead_s`` (measured separately)
    is split off the fitted constant.
    """
    from scipy.optimize import lsq_linear

    if not rows:
        raise ValueError("no measurements to fit")
    terms = np.array([ring_terms(r["kind"], n) for r in rows])  # [rows, 2]: hops, bytes factor
    nbytes = np.array([float(r["bytes"]) for r in rows])
    t = np.array([max(float(r["time_s"]), 1e-9) for r in rows])
    w = np.array([WORKLOAD_WEIGHT if r.get("workload") else 1.0 for r in rows]) / t
    hops = terms[:, 0] if len(set(terms[:, 0])) > 1 else np.zeros(len(rows))  # one hop count: cannot split
    # unknowns in us, us and ns/byte keep the columns on comparable scales
    A = np.stack([np.ones(len(rows)) * US, hops * US, terms[:, 1] * nbytes * 1e-9], axis=1) * w[:, None]
    x = lsq_linear(A, t * w, bounds=(0.0, np.inf)).x
    const, hop, ns_per_byte = float(x[0]) * US, float(x[1]) * US, float(x[2])
    call = min(call_overhead_s, const)
    bandwidth = 1e9 / ns_per_byte if ns_per_byte > 0 else MAX_BANDWIDTH_GBps * GB
    return FabricFit(call, const - call, hop, min(bandwidth, MAX_BANDWIDTH_GBps * GB))


def scaled(fit: FabricFit, factor: float) -> FabricFit:
    """``fit`` with every time term multiplied by ``factor`` (bandwidth divided by it)."""
    return FabricFit(fit.call_overhead_s * factor, fit.base_latency_s * factor, fit.hop_latency_s * factor,
                     fit.bandwidth_Bps / factor)


def inrun_factor(rows, n: int, fit: FabricFit) -> float:
    """How much slower the program's own collectives ran, with every rank busy, than
    ``fit`` (from the idle sweep) predicts: the geometric mean of measured / predicted
    over the in-run instances (rows {kind, bytes, time_s, count}). 1 when there are none.

    One factor for every term keeps the sweep's shape (latency vs bandwidth, per hop vs
    per call) and moves the level to where the scenario communicates: on a shared CPU
    host the busy ranks' cores, caches and memory bandwidth slow latency and transfer
    alike, and one or two sizes could not separate the terms anyway.
    """
    logs, weights = [], []
    for r in rows:
        pred = fit.predict(r["kind"], r["bytes"], n)
        if pred > 0 and r["time_s"] > 0:
            logs.append(np.log(r["time_s"] / pred))
            weights.append(float(r.get("count", 1)))
    return float(np.exp(np.average(logs, weights=weights))) if logs else 1.0


def pooled_cv(step_seconds_per_rank) -> float:
    """std/mean of one step's compute time over every rank and step (grand mean).

    Pooling over ranks counts a rank that is slower for the whole run as spread too:
    which rank a shared machine slows is itself random from run to run.
    """
    xs = [x for per in step_seconds_per_rank for x in per]
    mean = float(np.mean(xs)) if xs else 0.0
    return float(np.std(xs)) / mean if mean > 0 and len(xs) > 1 else 0.0


def own_slowness(step_seconds_per_rank) -> list:
    """Each rank's per-step times without the part all ranks share.

    On a shared host ranks often slow down together (another process takes a core from
    both); that common part sets the pace, which the mean rate already holds, but makes
    no rank wait for another. Ranks wait for what differs between them, so the jitter is
    fitted to ``x[r, t] - mean_r' x[r', t]`` (steps aligned by index), scaled by
    ``sqrt(n / (n - 1))`` so its variance is one rank's own, around the grand mean. A
    rank slower for the whole run keeps its offset. Fewer than 2 ranks: nothing.
    """
    series = [np.asarray(s, dtype=float) for s in step_seconds_per_rank]
    n, steps = len(series), min((len(s) for s in series), default=0)
    if n < 2 or steps < 2:
        return []
    x = np.stack([s[:steps] for s in series])
    return list((x - x.mean(axis=0)) * math.sqrt(n / (n - 1)) + x.mean())


def op_jitter_cv(step_cv: float, op_flops, rate: float, host_s: float) -> float:
    """The per-Compute-op cv that gives a simulated step the measured spread ``step_cv``.

    The simulator scales each op of simulated duration d_i = flops_i / rate + host by an
    independent factor of cv c, so a step's std is c * sqrt(sum d_i^2) and its mean
    sum d_i; hence c = step_cv * sum d_i / sqrt(sum d_i^2) (averaged over the steps in
    ``op_flops``, a list of per-step lists of FLOPs). One dominant op gives c = step_cv.
    """
    sums, squares = [], []
    for step in op_flops:
        d = [f / rate + host_s for f in step]
        if d:
            sums.append(sum(d))
            squares.append(sum(x * x for x in d))
    if not sums or step_cv <= 0:
        return 0.0
    return float(step_cv * np.mean(sums) / np.sqrt(np.mean(squares)))


def _ratio_of_autocorrelations(r, k: int) -> float:
    """Var(sum of k consecutive steps) / (k Var(step)) for lag-j autocorrelations
    ``r[j - 1]`` (j < k): 1 + 2 sum_j (1 - j/k) r_j."""
    return 1.0 + 2.0 * sum((1 - j / k) * rj for j, rj in enumerate(r, 1))


def variance_ratio(rho: float, k: int) -> float:
    """The k-step variance ratio of an AR(1) with lag-1 correlation ``rho`` (r_j = rho^j):
    1 + 2 sum_{j<k} (1 - j/k) rho^j (1 for independent steps)."""
    return _ratio_of_autocorrelations([rho**j for j in range(1, k)], k)


def persistence_rho(step_seconds_per_rank, period: int) -> float:
    """The AR(1) lag-1 correlation whose ``period``-step variance ratio equals the
    measured one; 0 for ``period < 2``, too few steps, or no excess over independence.

    The autocorrelations r_j (j < period) are pooled over ranks around the pooled mean,
    so a rank slower for the whole run counts as persistence (it is: the others wait for
    it at every averaging). The measured ratio is 1 + 2 sum_j (1 - j/period) r_j, the
    model's :func:`variance_ratio`, which grows with rho; bisection finds rho (at most
    0.99).
    """
    if period < 2:
        return 0.0
    series = [np.asarray(s, dtype=float) for s in step_seconds_per_rank if len(s) >= 3 * period]
    if not series:
        return 0.0
    mean = float(np.mean(np.concatenate(series)))
    c = [x - mean for x in series]
    var = float(np.mean(np.concatenate(c) ** 2))
    if var <= (1e-9 * mean) ** 2:  # steady to rounding: nothing persists
        return 0.0
    r = [sum(float(x[j:] @ x[:-j]) for x in c) / sum(len(x) - j for x in c) / var for j in range(1, period)]
    target = _ratio_of_autocorrelations(r, period)
    if target <= 1.0:
        return 0.0
    lo, hi = 0.0, 0.99
    if variance_ratio(hi, period) <= target:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if variance_ratio(mid, period) < target else (lo, mid)
    return (lo + hi) / 2


def sync_period(scenario) -> int:
    """Steps between the program's averaging collectives: what rank drift builds over."""
    t, c = scenario.training, scenario.communication
    if t.strategy in ("local_sgd", "diloco"):
        return t.local_steps
    if t.strategy == "oresearcher":
        return c.share_every if c.gradient_sharing else c.interval
    return 1


def fit_errors(rows, n: int, fit: FabricFit) -> list[dict]:
    """Each row with the fitted prediction and its relative error."""
    out = []
    for r in rows:
        p = fit.predict(r["kind"], r["bytes"], n)
        out.append({**r, "predicted_s": p, "error": (p - r["time_s"]) / r["time_s"]})
    return out


def compute_rate(m: dict, jitter: bool = False) -> float:
    """FLOP/s at which the simulator reproduces the measured compute of the program.

    The simulator charges each Compute op ``flops / rate + host overhead``; the measured
    seconds already hold the host overhead, so it is taken off before dividing. Without
    jitter the simulated ranks are identical, so the slowest rank's mean sets the pace
    (``compute_step_s``); with jitter the simulator draws the imbalance itself, so the
    rate is the mean over ranks (``compute_step_s_mean``) and the pace emerges.
    """
    if m["flops_per_step"] <= 0:
        raise UserError(f"the {m.get('strategy', '?')} program's Compute ops declare no FLOPs; nothing to calibrate")
    host = m.get("compute_ops_per_step", 0.0) * m["host_overhead_s"]
    step = m.get("compute_step_s_mean", m["compute_step_s"]) if jitter else m["compute_step_s"]
    return m["flops_per_step"] / max(step - host, 1e-9)


def jitter_fit(m: dict) -> tuple[float, float]:
    """The device profile's ``(compute_jitter_cv, compute_jitter_rho)`` from the measured
    per-step compute times, both fitted to what ranks do not share (:func:`own_slowness`).
    rho is :func:`persistence_rho` over the program's averaging period; the cv is the
    step's spread when one factor is drawn per step (rho > 0), else the per-op cv that
    gives a step that spread."""
    own = own_slowness(m.get("step_seconds_per_rank", []))
    step_cv = pooled_cv(own)
    rho = persistence_rho(own, int(m.get("sync_period", 1))) if step_cv > 0 else 0.0
    if rho > 0:
        return step_cv, rho
    return op_jitter_cv(step_cv, m.get("op_flops", []), compute_rate(m, jitter=True), m["host_overhead_s"]), 0.0


def device_doc(name: str, m: dict, memory_bytes: float, jitter: bool = False) -> dict:
    """The device profile: achieved FLOP/s per rank with every rank computing at once,
    and (``jitter``) the spread of a Compute op's duration."""
    rate = compute_rate(m, jitter)
    cv, rho = jitter_fit(m) if jitter else (0.0, 0.0)
    return {
        "kind": "device",
        "name": name,
        # measured at the scenario's dtype; a CPU runs the others no faster
        "peak_flops": {"fp32": rate, "bf16": rate, "fp16": rate},
        "efficiency": 1.0,  # the measured rate is already the achieved rate
        "memory_bytes": float(memory_bytes),
        "host_overhead_us": m["host_overhead_s"] / US,
        **({"compute_jitter_cv": cv} if cv > 0 else {}),
        **({"compute_jitter_rho": rho} if rho > 0 else {}),
    }


def fabric_doc(name: str, fit: FabricFit) -> dict:
    return {
        "kind": "fabric",
        "name": name,
        "topology": "switch",  # every rank of the host hangs off the loopback "switch"
        "bandwidth_GBps": fit.bandwidth_Bps / GB,
        "efficiency": 1.0,
        "base_latency_us": fit.base_latency_s / US,
        "hop_latency_us": fit.hop_latency_s / US,
        "call_overhead_us": fit.call_overhead_s / US,
    }


def profile_text(device: dict, fabric: dict, m: dict, errors: list[dict]) -> str:
    lines = [
        f"# Calibrated by `python -m oresearcher.calibrate` on {platform.node()} ({os.cpu_count()} cores),",
        f"# {m['backend']} with {m['world_size']} ranks, {time.strftime('%Y-%m-%d %H:%M')}.",
        f"# compute: the {m.get('strategy', '?')} program declares {m['flops_per_step']:.4g} FLOP per step in "
        f"{m.get('compute_ops_per_step', 0):.0f} Compute ops, measured {m['compute_step_s'] * 1e3:.3f} ms on the "
        f"slowest rank (all ranks at once, {m['dtype']}; per rank: "
        + ", ".join(f"{1e3 * t:.3f}" for t in m.get("compute_step_s_per_rank", [])) + " ms; "
        + "step time spread (std/mean) per rank: "
        + ", ".join(f"{c:.2f}" for c in m.get("compute_cv_per_rank", [])) + ").",
        f"# compute jitter: per-step spread pooled over ranks {pooled_cv(m.get('step_seconds_per_rank', [])):.3f}, "
        f"not shared with the other ranks {pooled_cv(own_slowness(m.get('step_seconds_per_rank', []))):.3f}"
        f" -> compute_jitter_cv {device.get('compute_jitter_cv', 0.0):.3f} per "
        + ("step" if device.get("compute_jitter_rho") else "Compute op") + "; "
        + (f"persistence over the program's {m['sync_period']}-step averaging period -> "
           f"compute_jitter_rho {device.get('compute_jitter_rho', 0.0):.3f}."
           if m.get("sync_period", 1) > 1 else "the program synchronises every step: no persistence to fit."),
        f"# in-run collectives: {m.get('inrun_factor', 1.0):.3f} x the idle sweep's fit (geometric mean of "
        "measured / fitted over the program's own collectives, every rank busy; 1: not applied).",
        "# collective fit (ring model): kind, bytes, measured us, fitted us, error "
        "(* the workload's sizes, idle; ** in the program's own run)",
    ]
    for e in errors:
        kind = e["kind"] + ("**" if e.get("in_run") else "*" if e.get("workload") else "")
        lines.append(f"#   {kind:<10} {e['bytes']:>10} {e['time_s'] / US:>11.1f} {e['predicted_s'] / US:>11.1f} "
                     f"{e['error']:+7.1%}")
    docs = [device, fabric]
    if m.get("roofline"):
        docs.append(roofline_doc(device, m["roofline"]))
        lines.append(f"# roofline ({device['name']}-roofline, sim/roofline.py): rates measured on rank 0 after the "
                     "sweep at the workload's shapes (backends/device_rates.py)")
    body = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=False)
    return "\n".join(lines) + "\n" + body


def roofline_doc(device: dict, rates: dict) -> dict:
    """A second device profile, ``<name>-roofline``: the roofline model with this host's
    measured matmul rate (as its peak), attention rate, memory bandwidth and launch cost.
    The flat profile stays the default: its rate is fitted to the calibrated program
    itself; the roofline one predicts other models and batch sizes from first principles."""
    from oresearcher.backends.device_rates import profile_fields

    rate = rates["matmul_flops"]
    return {"kind": "device", "name": device["name"] + "-roofline",
            "peak_flops": {"fp32": rate, "bf16": rate, "fp16": rate}, "efficiency": 1.0,
            "memory_bytes": device["memory_bytes"], "host_overhead_us": device["host_overhead_us"],
            "compute_model": "roofline", "foreach_optimizer": rates.get("foreach_optimizer", False),
            **profile_fields(rates)}


def default_sizes(max_bytes: int) -> list[int]:
    sizes, s = [], 1024
    while s <= max_bytes:
        sizes.append(s)
        s *= 4
    return sizes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m oresearcher.calibrate", description=__doc__.split("\n")[0],
        epilog="The profile holds a device and a fabric; point a scenario at it with cluster.profile_files, "
               "cluster.device and cluster.intra_node (see the module docstring).")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="torch.distributed backend to measure: gloo (CPU) or nccl (GPU) (default gloo)")
    p.add_argument("--scenario", default="scenarios/local-gloo.yaml",
                   help="scenario whose workload, strategy and world size are measured "
                        "(default scenarios/local-gloo.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field, e.g. training.strategy=local_sgd (repeatable)")
    p.add_argument("--num_agents", type=int, help="ranks to measure with (default: the scenario's agents.count)")
    p.add_argument("--out", metavar="FILE",
                   help="profile YAML to write (default runs/<scenario name>/profile.yaml)")
    p.add_argument("--device-name", default="cpu-calibrated",
                   help="name of the device profile written, for cluster.device (default cpu-calibrated)")
    p.add_argument("--fabric-name", default="gloo-calibrated",
                   help="name of the fabric profile written, for cluster.intra_node (default gloo-calibrated)")
    p.add_argument("--max-bytes", type=float, default=16e6,
                   help="largest collective of the size sweep, bytes; sizes go 1 KiB, x4, up to it (default 16e6)")
    p.add_argument("--repeats", type=int, default=7,
                   help="timed repetitions per collective size; the fit uses their mean (default 7)")
    p.add_argument("--compute-steps", type=int,
                   help="timed training steps (default: 30, or 30 averaging rounds of local_sgd/diloco, at most 300)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds before a silent or lost rank stops the calibration (default 120)")
    p.add_argument("--no-jitter", dest="jitter", action="store_false",
                   help="identical steady ranks: no compute_jitter_cv, the slowest rank's rate")
    p.add_argument("--no-in-run", dest="in_run", action="store_false",
                   help="fit the fabric to the idle sweep only, not scaled to the program's own collectives")
    p.add_argument("--learner", metavar="MODULE:FN", help="build learners with FN instead of the task registry")
    return p


def default_compute_steps(scenario) -> int:
    """Timed steps of the program run: 30, or for periodic averaging enough steps for 30
    rounds, at most 300 (the in-run collective cost is a mean over rounds, and the
    persistence estimate needs many periods: from 10 it often comes out 0)."""
    t = scenario.training
    if t.strategy in ("local_sgd", "diloco"):
        return min(300, max(30, 30 * t.local_steps))
    return 30


def _scenario(args):
    overrides = list(args.set)
    if args.num_agents:
        overrides.append(f"agents.count={args.num_agents}")
        cluster = load_raw(args.scenario).get("cluster") or {}
        if cluster.get("nodes", 1) == 1 and args.num_agents > cluster.get("gpus_per_node", 8):
            overrides.append(f"cluster.gpus_per_node={args.num_agents}")
    return load_scenario(args.scenario, overrides)


def write_profile(path: Path, m: dict, device_name: str, fabric_name: str, jitter: bool = True,
                  in_run: bool = True) -> FabricFit:
    """Fit and write the profile. ``jitter``: measure compute_jitter_cv (and take the mean
    rank's rate); ``in_run``: scale the sweep's fit to the program's own collectives."""
    n = m["world_size"]
    fit = fit_fabric(m["collectives"], n, m["call_overhead_s"])
    inrun = m.get("inrun_collectives", []) if in_run else []
    m = dict(m, inrun_factor=inrun_factor(inrun, n, fit) if inrun else 1.0)
    fit = scaled(fit, m["inrun_factor"])
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / n
    errors = fit_errors(m["collectives"] + inrun, n, fit)
    text = profile_text(device_doc(device_name, m, memory, jitter), fabric_doc(fabric_name, fit), m, errors)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return fit


def roofline_rates(scenario, backend: str):
    """This device's roofline rates at the scenario's model shapes (language-model
    presets only; None otherwise)."""
    w = scenario.workload
    if w.task != "synthetic-lm":
        return None
    from oresearcher.backends.device_rates import measure_rates
    from oresearcher.tasks.synthetic_lm import micro_batch

    device = "cuda" if backend == "nccl" else "cpu"
    return {**measure_rates(w.model, micro_batch(scenario), w.seq_len, w.dtype, device),
            "foreach_optimizer": device == "cuda"}


def main(argv=None) -> int:
    from oresearcher.backends import launcher
    from oresearcher.backends.worker import backend_unavailable

    args = build_parser().parse_args(argv)
    given, args.scenario = args.scenario, str(find_scenario(args.scenario))
    denv = launcher.from_environ()
    logging.basicConfig(level="INFO" if denv is None or denv.rank == 0 else "WARNING",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scenario = _scenario(args)
    if args.scenario != given:  # a shipped one: say which
        log.info("scenario file: %s", args.scenario)
    reason = backend_unavailable(args.backend)
    if reason:
        raise UserError(reason)
    if args.compute_steps is not None and args.compute_steps < 1:
        raise UserError(f"--compute-steps must be at least 1, got {args.compute_steps}")
    sizes = default_sizes(int(args.max_bytes))
    if denv is None:
        return _launch(args, argv, scenario.world_size)
    from oresearcher.backends.calibration import calibrate_rank

    m = calibrate_rank(scenario, denv, backend=args.backend, timeout_s=args.timeout, sizes=sizes,
                       repeats=args.repeats, compute_steps=args.compute_steps or default_compute_steps(scenario),
                       learner_spec=args.learner,
                       threads=int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    if m is not None:
        m["sync_period"] = sync_period(scenario)
        m["roofline"] = roofline_rates(scenario, args.backend)
        out = Path(args.out or Path("runs") / scenario.name / "profile.yaml")
        fit = write_profile(out, m, args.device_name, args.fabric_name, args.jitter, args.in_run)
        log.info("wrote %s: %.3g GFLOP/s per rank; %.2f GB/s, base %.0f us, hop %.0f us, call %.0f us",
                 out, compute_rate(m, args.jitter) / 1e9, fit.bandwidth_Bps / GB,
                 fit.base_latency_s / US, fit.hop_latency_s / US, fit.call_overhead_s / US)
    return 0


def _launch(args, argv, world: int) -> int:
    from oresearcher.backends import launcher

    cmd = [sys.executable, "-m", "oresearcher.calibrate", *(sys.argv[1:] if argv is None else argv)]
    log.info("measuring with %d local %s ranks", world, args.backend)
    result = launcher.launch_local(cmd, world, timeout_s=args.timeout)
    if not result.ok:
        if all(c == 2 for c in result.exit_codes):
            return 2
        print(f"error: calibration failed: {result.failure or 'a rank failed'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from oresearcher.backends.worker import entry_point

    entry_point(main)
