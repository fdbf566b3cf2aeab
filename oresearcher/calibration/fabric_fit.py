"""Fitting the fabric: call overhead, base and per-hop latency and bandwidth from timed
collectives (least squares over the ring model of :mod:`oresearcher.comm.schedules`), and how a fit
scales to what a training run sees."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..comm.schedules import ring_terms, ring_time
from ..comm.units import GB, NS, US, Bps_from_ns_per_byte, us_to_s

MAX_BANDWIDTH_GBps = 1e4  # when the fit finds no bandwidth term at all
WORKLOAD_WEIGHT = 5.0  # rows timed at the scenario's own sizes count this many times


@dataclass
class FabricFit:
    call_overhead_s: float
    base_latency_s: float
    hop_latency_s: float
    bandwidth_Bps: float

    def predict(self, kind: str, nbytes: float, n: int) -> float:
        return ring_time(kind, nbytes, n, self.call_overhead_s + self.base_latency_s, self.hop_latency_s,
                         self.bandwidth_Bps)

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
    t = np.array([max(float(r["time_s"]), NS) for r in rows])  # at least a nanosecond
    w = np.array([WORKLOAD_WEIGHT if r.get("workload") else 1.0 for r in rows]) / t
    hops = terms[:, 0] if len(set(terms[:, 0])) > 1 else np.zeros(len(rows))  # one hop count: cannot split
    # unknowns in us, us and ns/byte keep the columns on comparable scales
    A = np.stack([np.ones(len(rows)) * US, hops * US, terms[:, 1] * nbytes * NS], axis=1) * w[:, None]
    x = lsq_linear(A, t * w, bounds=(0.0, np.inf)).x
    const, hop, ns_per_byte = us_to_s(float(x[0])), us_to_s(float(x[1])), float(x[2])
    call = min(call_overhead_s, const)
    bandwidth = Bps_from_ns_per_byte(ns_per_byte) if ns_per_byte > 0 else MAX_BANDWIDTH_GBps * GB
    return FabricFit(call, const - call, hop, min(bandwidth, MAX_BANDWIDTH_GBps * GB))

def scaled(fit: FabricFit, factor: float) -> FabricFit:
    """``fit`` with every time term multiplied by ``factor`` (bandwidth divided by it)."""
    return FabricFit(fit.call_overhead_s * factor, fit.base_latency_s * factor, fit.hop_latency_s * factor,
                     fit.bandwidth_Bps / factor)

def inrun_factor(rows, n: int, fit: FabricFit) -> float:
    """How much slower the program's own collectives ran, with every rank busy, than
    ``fit`` (from the idle sweep) predicts: the geometric mean of measured / predicted
    over the in-run instances (rows {kind, bytes, time_s, count}, and ``ranks`` where the
    collective's group is smaller than ``n``). 1 when there are none.

    One factor for every term keeps the sweep's shape (latency vs bandwidth, per hop vs
    per call) and moves the level to where the scenario communicates: on a shared CPU
    host the busy ranks' cores, caches and memory bandwidth slow latency and transfer
    alike, and one or two sizes could not separate the terms anyway.
    """
    logs, weights = [], []
    for r in rows:
        pred = fit.predict(r["kind"], r["bytes"], r.get("ranks", n))
        if pred > 0 and r["time_s"] > 0:
            logs.append(np.log(r["time_s"] / pred))
            weights.append(float(r.get("count", 1)))
    return float(np.exp(np.average(logs, weights=weights))) if logs else 1.0

def fit_errors(rows, n: int, fit: FabricFit) -> list[dict]:
    """Each row with the fitted prediction and its relative error."""
    out = []
    for r in rows:
        p = fit.predict(r["kind"], r["bytes"], r.get("ranks", n))
        out.append({**r, "predicted_s": p, "error": (p - r["time_s"]) / r["time_s"]})
    return out
