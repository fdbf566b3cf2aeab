"""Measure this machine and write a hardware profile the simulator loads.

    python -m oresearcher.calibrate --backend=gloo          # writes runs/local-gloo/profile.yaml
    python -m oresearcher.calibrate --backend=gloo --scenario scenarios/local-gloo.yaml --num_agents=4 \\
        --out profiles/gloo-4.yaml
    python -m oresearcher.calibrate --backend=nccl --scenario S --set agents.count=1 ...   # one GPU:
        # matmul rate, memory bandwidth, launch cost (backends/calibration/device.py)

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

At each of the program's own collectives the ranks' times differ by how much earlier
each arrived and how much later each woke (:func:`backends.calibration.measure.merge_waits`).
The device's ``wake_delay_us`` is the mean wake-up delay with which the simulated
ranks' times there, drawn as the simulator draws them (:func:`simulated_meetings`),
spread as much on top of the fitted jitter (:func:`fit_wake`); the in-run rows then
keep the transfer alone. The profile says how much of the spread the jitter gives and
what the delay adds. ``--no-jitter`` fits no delay either.

For language-model scenarios on CPU the device profile also holds what the fsdp
schedule prices beside the FLOPs (``oresearcher/programs/fsdp_costs.py``), measured with
every rank busy (``backends/calibration/fsdp.py``): the rate of the FLOP-declaring Compute
ops alone (``pass_flops_per_s``), the copy bandwidth at a block's size, the sharded
optimizer's DTensor dispatch and plain step, and FSDP2's bookkeeping per parameter per
collective and its hooks per unit. Calibrating an fsdp scenario itself also times the
program's own step by pieces (``backends/calibration/fsdp_inrun.py``; its forward and
backward is one Compute op with FSDP2's collectives inside): the fabric is scaled to
FSDP2's collectives, each group of those constants to its share of the real step, and the
passes' rate (the device's rate too) is their FLOPs over the rest of forward and backward.

The device rate is the FLOPs the program's Compute ops declare divided by the time
they took: work the FLOP counts miss (optimizer steps, packing, a codec's elementwise
passes) is folded into the rate, so the profile fits the strategy it was measured
with. Calibrate with the scenario (strategy, codec, world size) you will predict. Calibrate at the world size you will run: ranks that
share cores are slower, and the profile records that.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .calibration.band import contention_change, cpu_ticks, stolen
from .calibration.fabric_fit import (  # noqa: F401 (re-exported: the calibration API)
    GB, MAX_BANDWIDTH_GBps, US, WORKLOAD_WEIGHT, FabricFit, fit_errors, fit_fabric, inrun_factor, scaled)
from .calibration.jitter import (  # noqa: F401
    fit_wake, op_jitter_cv, own_slowness, persistence_rho, pooled_cv, simulated_meetings, sync_period,
    variance_ratio)
from .calibration.profiles import (  # noqa: F401
    compute_rate, device_doc, fabric_doc, fsdp_fit, jitter_fit, profile_text, roofline_doc, wake_fit)
from .calibration.record import Measurement  # noqa: F401 (re-exported)
from .scenario import role_mix
from .errors import UserError
from .files import write_text
from .hardware import load_profile_file
from .scenario import load_raw, load_scenario
from .scenario.shipped import find_scenario

log = logging.getLogger("oresearcher.calibrate")


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
    if scenario.strategy.outer_loop:
        return min(300, max(30, 30 * t.local_steps))
    return 30


def _scenario(args):
    overrides = list(args.set)
    if args.num_agents:
        overrides.append(f"agents.count={args.num_agents}")
        raw = load_raw(args.scenario)
        cluster = raw.get("cluster") or {}
        if cluster.get("nodes", 1) == 1 and args.num_agents > cluster.get("gpus_per_node", 8):
            overrides.append(f"cluster.gpus_per_node={args.num_agents}")
        if not any(s.startswith("agents.roles") for s in args.set):  # keep the mix, as the run CLI does
            agents = role_mix.agents_at(load_raw(args.scenario, overrides), args.num_agents)
            roles = role_mix.override(raw.get("agents"), agents)
            if roles:
                overrides.append(roles)
    return load_scenario(args.scenario, overrides)


def write_profile(path: Path, m: Measurement, device_name: str, fabric_name: str, jitter: bool = True,
                  in_run: bool = True) -> FabricFit:
    """Fit and write the profile. ``jitter``: measure compute_jitter_cv (and take the mean
    rank's rate); ``in_run``: scale the sweep's fit to the program's own collectives."""
    m = Measurement.of(m)
    n = m.world_size
    fit = fit_fabric(m.collectives, n, m.call_overhead_s)
    inrun = m.inrun_collectives if in_run else []
    if jitter:  # the simulator draws the ranks' waiting and waking: the rows keep the transfer alone
        wake, floor = wake_fit(m)
        m = m.with_(wake_s=wake)
        inrun = [dict(r, time_s=max(r["time_s"] - floor, 0.1 * r["time_s"])) for r in inrun]
    m = m.with_(inrun_factor=inrun_factor(inrun, n, fit) if inrun else 1.0)
    fit = scaled(fit, m.inrun_factor)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / n
    errors = fit_errors(m.collectives + inrun, n, fit)
    fabric = fabric_doc(fabric_name, fit, m.backend or "gloo")
    text = profile_text(device_doc(device_name, m, memory, jitter), fabric, m, errors)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write_text(tmp, text)  # oresearcher.files: a link planted at the temp name is replaced, not followed
    try:  # what the simulator will refuse is refused here, where the cause is known
        load_profile_file(tmp)
    except UserError as e:
        tmp.unlink()
        raise UserError(f"{path}: the measured profile is not one the simulator can load ({str(e).split(': ', 1)[-1]}); "
                        f"the fit found {fit.bandwidth_Bps / GB:.3g} GB/s and an in-run factor of "
                        f"{m.inrun_factor:.3g}: a machine this busy cannot be calibrated, run it again when it is "
                        "quieter") from None
    tmp.replace(path)
    return fit


def roofline_rates(scenario, backend: str):
    """This device's roofline rates at the scenario's model shapes (language-model
    presets only; None otherwise)."""
    w = scenario.workload
    if not scenario.task.language_model:
        return None
    from oresearcher.backends.calibration.device_rates import measure_rates
    from oresearcher.models.workloads import per_rank_batch

    device = "cuda" if backend == "nccl" else "cpu"
    return {**measure_rates(w.model, per_rank_batch(scenario), w.seq_len, w.dtype, device),
            "foreach_optimizer": device == "cuda"}


def main(argv=None) -> int:
    from oresearcher.backends.run import launcher
    from oresearcher.backends.run.flags import hand_down, handed_down
    from oresearcher.backends.run.worker import backend_unavailable

    args = build_parser().parse_args(argv)
    given, args.scenario = args.scenario, str(find_scenario(args.scenario))
    denv = launcher.from_environ()
    logging.basicConfig(level="INFO" if denv is None or denv.rank == 0 else "WARNING",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scenario = handed_down(denv) or _scenario(args)  # a rank of _launch: the scenario parsed there
    if args.scenario != given:  # a shipped one: say which
        log.info("scenario file: %s", args.scenario)
    reason = backend_unavailable(args.backend)
    if reason:
        raise UserError(reason)
    if args.compute_steps is not None and args.compute_steps < 1:
        raise UserError(f"--compute-steps must be at least 1, got {args.compute_steps}")
    if args.backend == "nccl" and scenario.world_size == 1 and denv is None:  # no collectives: the device alone
        from .backends.calibration.device import run_cli
        return run_cli(args, scenario)
    sizes = default_sizes(int(args.max_bytes))
    if denv is None:
        _check_destination(Path(args.out or Path("runs") / scenario.name / "profile.yaml"))
        return _launch(args, argv, scenario.world_size, hand_down(scenario))
    from oresearcher.backends.calibration.measure import calibrate_rank

    ticks, load = cpu_ticks(), os.getloadavg()[0]  # the host while this calibration ran (the prediction's band)
    m = calibrate_rank(scenario, denv, backend=args.backend, timeout_s=args.timeout, sizes=sizes,
                       repeats=args.repeats, compute_steps=args.compute_steps or default_compute_steps(scenario),
                       learner_spec=args.learner,
                       threads=int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    if m is not None:
        m = m.with_(sync_period=sync_period(scenario), roofline=roofline_rates(scenario, args.backend),
                    stolen_share=stolen(ticks, cpu_ticks()),
                    contention_change=contention_change(load, os.getloadavg()[0], os.cpu_count() or 1))
        out = Path(args.out or Path("runs") / scenario.name / "profile.yaml")
        fit = write_profile(out, m, args.device_name, args.fabric_name, args.jitter, args.in_run)
        fsdp = fsdp_fit(m, args.jitter)  # the fsdp program's rate is its passes' (calibration/profiles.py)
        log.info("wrote %s: %.3g GFLOP/s per rank; %.2f GB/s, base %.0f us, hop %.0f us, call %.0f us",
                 out, (fsdp["pass_flops_per_s"] if fsdp else compute_rate(m, args.jitter)) / 1e9, fit.bandwidth_Bps / GB,
                 fit.base_latency_s / US, fit.hop_latency_s / US, fit.call_overhead_s / US)
    return 0


def _check_destination(out: Path) -> None:
    """The profile's destination, checked before the measurement (minutes) that it would lose."""
    from .files import writable_dir

    if out.is_dir():
        raise UserError(f"--out {out}: a directory; the profile is a file (e.g. {out / 'profile.yaml'})")
    writable_dir(out.parent)


def _launch(args, argv, world: int, env: dict | None = None) -> int:
    """Start the ranks; ``env``: theirs, with the parsed scenario (backends/run/flags.py hand_down)."""
    from oresearcher.backends.run import launcher

    cmd = [sys.executable, "-m", "oresearcher.calibrate", *(sys.argv[1:] if argv is None else argv)]
    log.info("measuring with %d local %s ranks", world, args.backend)
    result = launcher.launch_local(cmd, world, timeout_s=args.timeout, env=env)
    if not result.ok:
        if 2 in result.exit_codes and 1 not in result.exit_codes:
            return 2  # a rank printed its one-line refusal (rank 0 alone writes the profile); no crash beside it
        print(f"error: calibration failed: {result.failure or 'a rank failed'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from oresearcher.backends.run.worker import entry_point

    entry_point(main)
