"""Profile documents: the device and fabric YAML documents (and the roofline fields) that
``oresearcher.calibrate`` writes from a measurement, as the simulator loads them."""
from __future__ import annotations

import os
import platform
import statistics
import time

import yaml

from ..hardware import JITTER_CV_MAX

from ..errors import UserError
from ..comm.units import GB, NS, US, s_to_us
from .fabric_fit import FabricFit
from .band import BLOCKS, USEFUL, difference_cv, exposed_series, exposed_share, group_pace, half_widths
from .jitter import fit_wake, op_jitter_cv, own_slowness, persistence_rho, pooled_cv, simulated_meetings
from .record import Measurement


def compute_rate(m: Measurement, jitter: bool = False) -> float:
    """FLOP/s at which the simulator reproduces the measured compute of the program.

    The simulator charges each Compute op ``flops / rate + host overhead``; the measured
    seconds already hold the host overhead, so it is taken off before dividing. Without
    jitter the simulated ranks are identical, so the slowest rank's mean sets the pace
    (``compute_step_s``); with jitter the simulator draws the imbalance itself, so the
    rate is the mean over ranks (``compute_step_s_mean``) and the pace emerges. Where the
    ranks declare different FLOPs (several agents per rank, handed device time by shares),
    each rank's rate is its own FLOPs over its own seconds: the slowest of those without
    jitter, all FLOPs over all seconds with it.
    """
    m = Measurement.of(m)
    if m.flops_per_step <= 0:
        raise UserError(f"the {m.strategy} program's Compute ops declare no FLOPs; nothing to calibrate")
    if _ranks_differ(m, m.compute_step_s_per_rank):  # several agents per rank by shares
        return _own_rates(m, m.compute_step_s_per_rank, m.compute_ops_per_step_per_rank, m.compute_ops_per_step, jitter)
    host = m.compute_ops_per_step * m.host_overhead_s
    step = m.mean_step_s if jitter else m.compute_step_s
    return m.flops_per_step / max(step - host, 1e-9)


def _ranks_differ(m: Measurement, secs: list) -> bool:
    """Whether the ranks declared different FLOPs (and ``secs`` has one entry per rank):
    then rank 0's count does not hold for the others."""
    flops = m.flops_per_step_per_rank
    return bool(flops) and len(flops) == len(secs) and len(set(flops)) > 1


def _own_rates(m: Measurement, secs: list, ops: list, ops_default: float, jitter: bool) -> float:
    """Each rank's own FLOPs over its own seconds (less its ops' host overhead): the
    slowest of those rates sets the pace; with jitter, all FLOPs over all seconds."""
    ops = ops if len(ops) == len(secs) else [ops_default] * len(secs)
    pairs = [(f, s - n * m.host_overhead_s) for f, s, n in zip(m.flops_per_step_per_rank, secs, ops)]
    if jitter:
        return sum(f for f, _ in pairs) / max(sum(t for _, t in pairs), 1e-9)
    return min(f / max(t, 1e-9) for f, t in pairs)


def pass_rate(m: Measurement, jitter: bool = False) -> float | None:
    """FLOP/s of the program's FLOP-declaring Compute ops alone (the model's passes), as
    :func:`compute_rate` takes it (host overhead off; mean rank with jitter, else the
    slowest; each rank's own FLOPs where they differ); None where the run did not time them."""
    m = Measurement.of(m)
    per = m.pass_step_s_per_rank
    if not per or any(t is None for t in per) or m.flops_per_step <= 0:
        return None
    if _ranks_differ(m, per):
        return _own_rates(m, per, [], m.pass_ops_per_step, jitter)
    step = statistics.fmean(per) if jitter else max(per)
    return m.flops_per_step / max(step - m.pass_ops_per_step * m.host_overhead_s, 1e-9)


def fsdp_fit(m: Measurement, jitter: bool = False) -> dict | None:
    """The fsdp schedule's host costs at the level of the fsdp program's own step
    (``Measurement.fsdp_step``, backends/calibration/fsdp_inrun.py); None where it was not
    timed. Each group's seconds per step (the slowest rank's; with jitter the mean over
    ranks, as :func:`compute_rate`) over what the schedule charges for it at the
    microbenchmarks' constants scales that group's constants:

    - FSDP2's copies and bookkeeping by ``c``: copy bandwidth / c, bookkeeping per
      parameter per all-gather and per reduce-scatter x c;
    - the optimizer by ``o``: DTensor dispatch per parameter and the plain step per
      element x o;
    - the passes: their FLOPs over the rest of forward and backward less the hooks the
      schedule charges (the microbenchmark's), ``pass_flops_per_s``.

    Returns the profile fields, and ``copies_factor``, ``optimizer_factor``."""
    m = Measurement.of(m)
    s = m.fsdp_step
    if not s or m.copy_Bps is None or m.dtensor_param_step_s is None:
        return None
    pick = statistics.fmean if jitter else max
    sched = s["schedule"]
    passes = pick(s["passes_s"]) - sched["hooks_s"]
    if sched["copies_s"] <= 0 or sched["optimizer_s"] <= 0 or passes <= 0 or sched["pass_flops"] <= 0:
        raise UserError("the fsdp step's pieces could not be told apart (a group took no time, or the hooks "
                        "the microbenchmark measured exceed the passes): calibrate again on a quieter host")
    c = pick(s["copies_s"]) / sched["copies_s"]
    o = pick(s["optimizer_s"]) / sched["optimizer_s"]
    return {"pass_flops_per_s": sched["pass_flops"] / passes,
            "memory_bandwidth_GBps": m.copy_Bps / c / GB,
            "dtensor_param_step_us": m.dtensor_param_step_s * o / US,
            "optimizer_element_ns": m.optimizer_element_s * o / NS,
            "fsdp_gather_param_us": m.gather_param_s * c / US,
            "fsdp_reduce_param_us": m.reduce_param_s * c / US,
            "copies_factor": c, "optimizer_factor": o}


def jitter_fit(m: Measurement) -> tuple[float, float]:
    """The device profile's ``(compute_jitter_cv, compute_jitter_rho)`` from the measured
    per-step compute times, both fitted to what ranks do not share (:func:`own_slowness`).
    rho is :func:`persistence_rho` over the program's averaging period; the cv is the
    step's spread when one factor is drawn per step (rho > 0), else the per-op cv that
    gives a step that spread."""
    m = Measurement.of(m)
    own = own_slowness(m.step_seconds_per_rank)
    step_cv = pooled_cv(own)
    rho = persistence_rho(own, int(m.sync_period)) if step_cv > 0 else 0.0
    if rho > 0:
        return min(step_cv, JITTER_CV_MAX), rho
    cv = op_jitter_cv(step_cv, m.op_flops, compute_rate(m, jitter=True), m.host_overhead_s)
    return min(cv, JITTER_CV_MAX), 0.0  # a busier host than a profile can describe: capped, and said

def band_fit(m: Measurement) -> dict | None:
    """The prediction band's relative half widths (:mod:`.band`) from the calibration's own
    repeats: how far the mean of its steps (mean over ranks), and of the time ranks were held
    at the program's own collectives (each one's in-run transfer plus its waits), may differ
    from a run's (the level's drift over consecutive blocks and each step's scatter), plus the CPU share stolen and the change of a core's share
    (the host's contention) while it ran. None with fewer than
    two steps a block (nothing to see the level move in)."""
    m = Measurement.of(m)
    pace = group_pace(m.step_seconds_per_rank)
    if len(pace) < 2 * BLOCKS:
        return None
    by_kind = {}
    for r in m.inrun_collectives:
        by_kind.setdefault(r["kind"], []).append(r["time_s"])
    held = exposed_series(m.arrival_waits, {k: statistics.fmean(ts) for k, ts in by_kind.items()})
    return half_widths(difference_cv(pace), difference_cv(held), (m.stolen_share or 0.0) + (m.contention_change or 0.0),
                       exposed_share(pace, held))


def _band_line(device: dict) -> list[str]:
    b = device.get("prediction_band")
    if not b:
        return []
    wide = [k.replace("_", " ") for k, w in b.items() if w > USEFUL]
    return [f"# prediction band: step time +-{b['step_time']:.0%}, communication overhead +-{b['comm_overhead']:.0%} "
            f"(a 95% band on a run's mean against this calibration's: the level's drift over {BLOCKS} blocks "
            "of its steps and collectives and each one's scatter, weighed by their share of a step, plus "
            "the CPU share stolen and the change of a core's share while it ran; calibration/band.py)"
            + (f"; wider than +-{USEFUL:.0%} for {', '.join(wide)}: this host moved too much while it was measured"
               if wide else "") + "."]


def wake_fit(m: Measurement) -> tuple[float, float]:
    """``(wake_s, floor_s)``: the mean wake-up delay after a collective with which the
    simulated ranks' times at the program's own collectives spread as the measured ones
    did (:func:`fit_wake`, on top of the fitted jitter), and the part of the shortest
    rank's time in each such collective that is waiting and waking, not transfer (mean
    over them; the in-run rows take it off before the fabric is scaled to them). (0, 0)
    without the waits (the fsdp program: its collectives run inside its Compute op)."""
    m = Measurement.of(m)
    if not m.arrival_waits or m.fsdp_step or m.world_size < 2:
        return 0.0, 0.0
    cv, rho = jitter_fit(m)
    rate = compute_rate(m, jitter=True)
    wake = fit_wake(m.arrival_waits, rate, m.host_overhead_s, cv, m.world_size, rho)
    floor = simulated_meetings(m.arrival_waits, rate, m.host_overhead_s, cv, m.world_size, rho, wake)[1]
    return wake, floor

def device_doc(name: str, m: Measurement, memory_bytes: float, jitter: bool = False) -> dict:
    """The device profile: achieved FLOP/s per rank with every rank computing at once,
    and (``jitter``) the spread of a Compute op's duration."""
    m = Measurement.of(m)
    rate = compute_rate(m, jitter)
    cv, rho = jitter_fit(m) if jitter else (0.0, 0.0)
    wake = (wake_fit(m)[0] if m.wake_s is None else m.wake_s) if jitter else 0.0
    fit = fsdp_fit(m, jitter)
    if fit is not None:  # the fsdp program's Compute op holds its collectives: its rate is its passes'
        rate = fit["pass_flops_per_s"]
    doc = {
        "kind": "device",
        "name": name,
        # measured at the scenario's dtype; a CPU runs the others no faster
        "peak_flops": {"fp32": rate, "bf16": rate, "fp16": rate},
        "efficiency": 1.0,  # the measured rate is already the achieved rate
        "memory_bytes": float(memory_bytes),
        "host_overhead_us": m.host_overhead_s / US,
        **({"compute_jitter_cv": cv} if cv > 0 else {}),
        **({"compute_jitter_rho": rho} if rho > 0 else {}),
        **({"wake_delay_us": wake / US} if wake > 0 else {}),
        **({"streams": False} if m.backend == "gloo" else {}),  # CPU ranks (oresearcher/hardware/__init__.py)
        # the fsdp schedule's host costs (programs/fsdp_costs.py, backends/calibration/fsdp.py)
        **({"pass_flops_per_s": passes} if (passes := pass_rate(m, jitter)) else {}),
        **({"memory_bandwidth_GBps": m.copy_Bps / GB} if m.copy_Bps else {}),
        **({"dtensor_param_step_us": m.dtensor_param_step_s / US} if m.dtensor_param_step_s is not None else {}),
        **({"optimizer_element_ns": m.optimizer_element_s / NS} if m.optimizer_element_s is not None else {}),
        **({"fsdp_gather_param_us": m.gather_param_s / US} if m.gather_param_s is not None else {}),
        **({"fsdp_reduce_param_us": m.reduce_param_s / US} if m.reduce_param_s is not None else {}),
        **({"fsdp_unit_step_us": m.unit_step_s / US} if m.unit_step_s is not None else {}),
        **({"host_link_GBps": m.host_link_Bps / GB} if m.host_link_Bps else {}),  # hosted agents' switches
        **({"prediction_band": band} if (band := band_fit(m)) else {}),  # calibration/band.py
    }
    if fit is not None:
        doc.update({k: v for k, v in fit.items() if not k.endswith("_factor")})
    return doc

def _waits_line(device: dict, m: Measurement) -> list[str]:
    """How much the ranks' times at the program's own collectives differed (each rank's
    time less the shortest: how much earlier it came, and how much later it woke),
    beside what the fitted jitter alone gives the simulated ranks there, and with the
    fitted wake-up delay (:func:`simulated_meetings`)."""
    if not m.arrival_waits or m.fsdp_step:
        return []
    measured = statistics.fmean(r["wait_s"] for r in m.arrival_waits)

    def meet(wake_s):
        return simulated_meetings(m.arrival_waits, device["peak_flops"][m.dtype], m.host_overhead_s,
                                  device.get("compute_jitter_cv", 0.0), m.world_size,
                                  device.get("compute_jitter_rho", 0.0), wake_s)

    def ms(spread):
        return f"{1e3 * spread:.2f} ms ({spread / measured:.0%})" if measured > 0 else f"{1e3 * spread:.2f} ms"

    head = (f"# waits at the program's own collectives: each rank's time less the shortest, {1e3 * measured:.2f} ms "
            f"(mean over {len(m.arrival_waits)} collectives and the ranks); the fitted jitter alone gives the "
            f"simulated ranks {ms(meet(0.0)[0])}")
    wake = device.get("wake_delay_us", 0.0) * US
    if wake <= 0:
        return [head + "; no wake-up delay is needed."]
    spread, floor = meet(wake)
    tail = (f"; the in-run rows (**) are the shortest rank's times less the {1e3 * floor:.2f} ms of waiting and "
            "waking the simulator draws there." if m.inrun_factor != 1.0 else ".")
    return [head + f", with a mean wake-up delay of {wake / US:.0f} us after each collective (wake_delay_us) "
            f"{ms(spread)}" + tail]

def fabric_doc(name: str, fit: FabricFit, backend: str = "gloo") -> dict:
    return {
        "kind": "fabric",
        "name": name,
        "topology": "switch",  # every rank of the host hangs off the loopback "switch"
        "bandwidth_GBps": fit.bandwidth_Bps / GB,
        "efficiency": 1.0,
        "base_latency_us": fit.base_latency_s / US,
        "hop_latency_us": fit.hop_latency_s / US,
        "call_overhead_us": fit.call_overhead_s / US,
        **({"reduce_scatter": "all_reduce"} if backend == "gloo" else {}),  # oresearcher/hardware/__init__.py, FabricProfile
    }

def profile_text(device: dict, fabric: dict, m: Measurement, errors: list[dict]) -> str:
    m = Measurement.of(m)
    steps = m.step_seconds_per_rank
    lines = [
        f"# Calibrated by `python -m oresearcher.calibrate` on {platform.node()} ({os.cpu_count()} cores),",
        f"# {m.backend} with {m.world_size} ranks, {time.strftime('%Y-%m-%d %H:%M')}.",
        f"# compute: the {m.strategy} program declares {m.flops_per_step:.4g} FLOP per step in "
        f"{m.compute_ops_per_step:.0f} Compute ops, measured {m.compute_step_s * 1e3:.3f} ms on the "
        f"slowest rank (all ranks at once, {m.dtype}; per rank: "
        + ", ".join(f"{1e3 * t:.3f}" for t in m.compute_step_s_per_rank) + " ms; "
        + "step time spread (std/mean) per rank: "
        + ", ".join(f"{c:.2f}" for c in m.compute_cv_per_rank) + ")"
        + ("; the ranks declare different FLOPs (" + ", ".join(f"{f:.4g}" for f in m.flops_per_step_per_rank)
           + "), so each rank's rate is its own FLOPs over its own time and the slowest rate is kept"
           if _ranks_differ(m, m.compute_step_s_per_rank) else "") + ".",
        f"# compute jitter: per-step spread pooled over ranks {pooled_cv(steps):.3f}, "
        f"not shared with the other ranks {pooled_cv(own_slowness(steps)):.3f}"
        f" -> compute_jitter_cv {device.get('compute_jitter_cv', 0.0):.3f} per "
        + ("step" if device.get("compute_jitter_rho") else "Compute op")
        + (f" (capped at {JITTER_CV_MAX:g}: this host was too busy to calibrate faithfully)"
           if device.get("compute_jitter_cv", 0.0) >= JITTER_CV_MAX else "") + "; "
        + (f"persistence over the program's {m.sync_period}-step averaging period -> "
           f"compute_jitter_rho {device.get('compute_jitter_rho', 0.0):.3f}."
           if m.sync_period > 1 else "the program synchronises every step: no persistence to fit."),
        *_waits_line(device, m),
        *_band_line(device),
        f"# in-run collectives: {m.inrun_factor:.3f} x the idle sweep's fit (geometric mean of "
        "measured / fitted over the program's own collectives, every rank busy; 1: not applied).",
        *(_fsdp_step_lines(device, m) if m.fsdp_step and "pass_flops_per_s" in device else []),
        *([f"# passes: the {m.compute_ops_per_step:.0f} Compute ops include {m.pass_ops_per_step:.0f} that declare "
           f"FLOPs (the model's forward and backward), measured {1e3 * max(m.pass_step_s_per_rank):.3f} ms on the "
           f"slowest rank -> pass_flops_per_s {device['pass_flops_per_s']:.4g} (the fsdp schedule prices its "
           "passes at it)."] if "pass_flops_per_s" in device and not m.fsdp_step else []),
        *([f"# fsdp host costs, every rank at once (median over ranks): copying a block "
           f"{m.copy_Bps / GB:.3g} GB/s (read + write) -> memory_bandwidth_GBps; a DTensor shard's "
           f"optimizer step {m.dtensor_param_step_s / US:.1f} us per parameter over a "
           f"plain tensor's -> dtensor_param_step_us; the plain step {m.optimizer_element_s / NS:.2f} ns per "
           "local element -> optimizer_element_ns."] if m.copy_Bps else []),
        *([f"# fsdp bookkeeping (FSDP2's own functions, one element per rank per parameter): "
           f"{m.gather_param_s / US:.1f} us per parameter per all-gather -> fsdp_gather_param_us, "
           f"{m.reduce_param_s / US:.1f} us per reduce-scatter -> fsdp_reduce_param_us; hooks "
           f"{(m.unit_step_s or 0.0) / US:.1f} us per unit per step -> fsdp_unit_step_us."]
          if m.gather_param_s is not None else []),
        "# collective fit (ring model): kind, bytes, measured us, fitted us, error "
        "(* the workload's sizes, idle; ** in the program's own run)",
    ]
    for e in errors:
        kind = e["kind"] + ("**" if e.get("in_run") else "*" if e.get("workload") else "")
        lines.append(f"#   {kind:<10} {e['bytes']:>10} {e['time_s'] / US:>11.1f} {e['predicted_s'] / US:>11.1f} "
                     f"{e['error']:+7.1%}" + (f"  (a group of {e['ranks']} ranks)" if e.get("ranks") else ""))
    docs = [device, fabric]
    if m.roofline:
        docs.append(roofline_doc(device, m.roofline))
        lines.append(f"# roofline ({device['name']}-roofline, sim/roofline.py): rates measured on rank 0 after the "
                     "sweep at the workload's shapes (backends/calibration/device_rates.py)")
    body = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=False)
    return "\n".join(lines) + "\n" + body

def _fsdp_step_lines(device: dict, m: Measurement) -> list[str]:
    """What :func:`fsdp_fit` did, for the profile's header."""
    s, sched = m.fsdp_step, m.fsdp_step["schedule"]
    ms = lambda xs: ", ".join(f"{1e3 * x:.2f}" for x in xs)  # noqa: E731
    return [
        "# fsdp step, the program's own (every rank busy; ms per step per rank): passes and hooks "
        f"{ms(s['passes_s'])}, FSDP2's copies {ms(s['copies_s'])}, optimizer {ms(s['optimizer_s'])}, "
        f"collectives {ms(s['comm_s'])}. The schedule at the microbenchmarks' constants: copies "
        f"{1e3 * sched['copies_s']:.2f}, optimizer {1e3 * sched['optimizer_s']:.2f}, hooks "
        f"{1e3 * sched['hooks_s']:.2f} ms.",
        f"# -> copies x {m.copy_Bps / GB / device['memory_bandwidth_GBps']:.3f} (memory_bandwidth_GBps "
        f"{device['memory_bandwidth_GBps']:.3g}, bookkeeping per parameter likewise), optimizer x "
        f"{device['dtensor_param_step_us'] * US / m.dtensor_param_step_s:.3f}; the passes' {sched['pass_flops']:.4g} "
        f"FLOP over passes and hooks less the hooks -> pass_flops_per_s {device['pass_flops_per_s']:.4g} "
        "(also the device's rate: the program's Compute op holds its collectives). The constants below the "
        "microbenchmark lines are these scaled ones.",
    ]


def profile_fields(rates: dict) -> dict:
    """The device profile's roofline fields for measured ``rates`` (peak = the measured
    matmul rate, so its achievable fraction is 1)."""
    return {"memory_bandwidth_GBps": rates["memory_bandwidth_Bps"] / GB, "memory_efficiency": 1.0,
            "launch_us": s_to_us(rates["launch_s"]),
            "achievable": {"matmul": 1.0, "attention": min(1.0, rates["attention_flops"] / rates["matmul_flops"]),
                           "vector": 1.0}}


def roofline_doc(device: dict, rates: dict) -> dict:
    """A second device profile, ``<name>-roofline``: the roofline model with this host's
    measured matmul rate (as its peak), attention rate, memory bandwidth and launch cost.
    The flat profile stays the default: its rate is fitted to the calibrated program
    itself; the roofline one predicts other models and batch sizes from first principles."""
    rate = rates["matmul_flops"]
    return {"kind": "device", "name": device["name"] + "-roofline",
            "peak_flops": {"fp32": rate, "bf16": rate, "fp16": rate}, "efficiency": 1.0,
            "memory_bytes": device["memory_bytes"], "host_overhead_us": device["host_overhead_us"],
            "compute_model": "roofline", "foreach_optimizer": rates.get("foreach_optimizer", False),
            **profile_fields(rates)}
