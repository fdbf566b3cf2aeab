"""Scenario in, report out: assemble profiles, topology, learners and programs, run.

``simulate(scenario)`` is what the CLI, the sweeps, the benchmarks and the other
packages call. It returns the report dict (schema in :mod:`oresearcher.reporting.report`) and the
:class:`~oresearcher.reporting.report.Timeline` the figures and the trace are drawn from.
"""
from __future__ import annotations

import logging

import torch

from oresearcher.errors import UserError
from oresearcher.comm import build_topology
from oresearcher.hardware import catalogue, lookup
from oresearcher.programs import AgentContext, get_program
from oresearcher.reporting.report import Timeline, summarize
from oresearcher.scenario import Scenario, scenario_dir
from oresearcher.tasks import make_learner

from .engine import Engine
from .faults import fault_plan, fault_report, variant
from .symmetry import SymmetryBroken, symmetry_classes

log = logging.getLogger(__name__)


def resolve_mode(scenario: Scenario) -> str:
    mode = scenario.simulation.mode
    if mode == "auto":
        return "shape" if scenario.task.shape_mode else "numeric"
    if mode == "shape" and not scenario.task.shape_mode:
        from oresearcher.tasks import TASKS, get_task

        able = " or ".join(n for n in TASKS if get_task(n).shape_mode)
        raise UserError(f"simulation.mode: shape mode needs workload.task {able} (got {scenario.workload.task!r})")
    return mode


def build_cluster(scenario: Scenario):
    """(device profile, topology) for the scenario; UserError names the bad field."""
    cl = scenario.cluster
    cat = catalogue(cl.profile_files, scenario_dir(scenario))
    src = str(getattr(scenario, "_source", None) or scenario.name)
    device = lookup(cat, "device", cl.device, f"{src}: cluster.device")
    intra = lookup(cat, "fabric", cl.intra_node, f"{src}: cluster.intra_node")
    inter = lookup(cat, "fabric", cl.inter_node, f"{src}: cluster.inter_node") if cl.inter_node else None
    if (scenario.strategy.cooperative and scenario.cooperation.allocation.agents_per_device > 1
            and getattr(device, "host_link_GBps", None) is None):
        raise UserError(f"{src}: cluster.device {device.name!r} has no host_link_GBps, which hosted agents "
                        "(cooperation.allocation.agents_per_device > 1) need to price their switches; add it to "
                        "the profile (oresearcher.calibrate writes it for such a scenario)")
    network = None
    if cl.network is not None:  # oresearcher/comm/tiers.py: each tier's uplinks priced by its own fabric
        from oresearcher.comm.tiers import Tier

        fabrics = [inter if t.fabric is None else lookup(cat, "fabric", t.fabric, f"{src}: cluster.network.tiers[{i}]"
                                                         ".fabric") for i, t in enumerate(cl.network.tiers)]
        network = (cl.network.kind, [Tier(t.group, float(t.oversubscription), f.bandwidth)
                                     for t, f in zip(cl.network.tiers, fabrics)])
    topo = build_topology(scenario.world_size, cl.gpus_per_node, intra, inter, cl.nics_per_node, network=network,
                          node_pcie=_node_pcie(cl, cat, src))
    return device, topo


def _node_pcie(cl, cat, src: str):
    """(the node's PCIe layout, GDR level) of a cluster that names a layout, else None
    (oresearcher/comm/pcie.py: GPUDirect RDMA and LL128 as the layout allows)."""
    if not cl.node_layout:
        return None
    layout = lookup(cat, "node", cl.node_layout, f"{src}: cluster.node_layout")
    if (layout.gpus, layout.nics) != (cl.gpus_per_node, cl.nics_per_node):
        raise UserError(f"{src}: cluster.node_layout {layout.name!r} has {layout.gpus} GPUs and {layout.nics} "
                        f"NICs; cluster.gpus_per_node is {cl.gpus_per_node}, nics_per_node {cl.nics_per_node}")
    return layout, cl.gdr_level


def memory_report(scenario: Scenario, device) -> dict | None:
    """Per-GPU memory estimate of an LM workload, or None for small tasks."""
    if not scenario.task.language_model:
        return None
    from oresearcher.models.workloads import measure_lm, per_rank_batch

    from .memory import estimate_memory

    w = scenario.workload
    cost = measure_lm(w.model, per_rank_batch(scenario), w.seq_len, w.dtype, w.activation_checkpointing)
    if scenario.strategy.shards:
        return fsdp_memory_report(scenario, cost, device)
    codec = scenario.communication.codec.make()  # None: no compression, no codec buffers
    # one encoded copy of the gradients plus the gathered/decoded buffer
    codec_bytes = 0 if codec is None else 2 * codec.wire_bytes(cost.params)
    est = estimate_memory(cost, micro_batch=per_rank_batch(scenario), dtype=w.dtype, optimizer=w.optimizer,
                          checkpointing=w.activation_checkpointing, codec_buffer_bytes=codec_bytes,
                          device_memory_bytes=int(device.memory_bytes))
    return {k: getattr(est, k) for k in ("weights", "grads", "optimizer_state", "activations",
                                          "codec_buffers", "total", "fits", "advice")}


def fsdp_memory_report(scenario: Scenario, cost, device) -> dict:
    """Per-GPU memory of an fsdp rank; weights/grads hold sharded + gathered parts."""
    from oresearcher.models.sharding import scenario_plan

    from .memory import FsdpSetup, estimate_fsdp_memory

    plan, w = scenario_plan(scenario), scenario.workload
    setup = FsdpSetup(
        params=plan.params, root_params=plan.root.numel, block_params=max((b.numel for b in plan.blocks), default=0),
        blocks=len(plan.blocks), shard_size=scenario.fsdp.group_size(scenario.world_size), compute_dtype=w.dtype,
        reduce_fp32=scenario.fsdp.reduce_dtype == "fp32", optimizer=w.optimizer,
        reshard_after_forward=scenario.fsdp.reshard_after_forward)
    est = estimate_fsdp_memory(
        setup, activation_bytes=cost.saved_activation_bytes(w.activation_checkpointing),
        device_memory_bytes=int(device.memory_bytes), sam=_sam_agents(scenario))
    parts = {k: getattr(est, k) for k in ("sharded_params", "sharded_grads", "optimizer_state", "gathered_params",
                                          "grad_buffers", "activations", "total", "fits")}
    return {**parts, "weights": est.sharded_params + est.gathered_params + est.sam_saved,
            "grads": est.sharded_grads + est.grad_buffers, "codec_buffers": 0,
            "advice": "" if est.fits else "does not fit even sharded: enable activation checkpointing, "
                      "a smaller micro batch or a larger shard group"}


def _sam_agents(scenario: Scenario) -> bool:
    """Whether some sharded agent's rank can hold a SAM copy of its shard: an optimizer
    among the roles, or dynamic roles that may make one (the peak rank's memory)."""
    from oresearcher.cooperation.sharded_roles import agent_roles

    roles, spec = agent_roles(scenario), scenario.cooperation.roles
    if roles is None or spec.optimizer_method != "sam":
        return False
    return "optimizer" in roles or spec.policy == "dynamic"


def compute_pricing(scenario: Scenario, device):
    """The roofline pricing (sim/roofline.py) where the device profile asks for it and the
    workload is a language-model preset; None (the flat FLOP rate) otherwise."""
    if device.compute_model != "roofline" or not scenario.task.language_model:
        return None
    from oresearcher.models.workloads import per_rank_batch

    from .roofline import RooflinePricing, price_lm_step

    w = scenario.workload
    price = price_lm_step(device, w.model, per_rank_batch(scenario), w.seq_len, w.dtype, w.activation_checkpointing,
                          w.optimizer)
    share = 1.0
    if scenario.strategy.shards:
        share = 1.0 / scenario.fsdp.group_size(scenario.world_size)
    return RooflinePricing(price, optimizer_share=share)


def without_controller(scenario: Scenario, mode: str) -> dict:
    """The same run without the overhead controller (``communication.budget`` unset): its
    step time and overhead, for the one line the report prints beside the controlled run's.
    Shape mode only: a numeric run would train a second time (convergence proxies, the
    budget experiments), and those compare against their own uncontrolled rows."""
    plain = scenario.model_copy(update={"communication": scenario.communication.model_copy(update={"budget": None})})
    r = simulate(plain, mode=mode, keep_spans=0, fault_baselines=False)[0]
    return {"step_time_s": r["step_time_s"], "comm_overhead": r["comm_overhead"],
            "exposed_comm_time_s": r["exposed_comm_time_s"]}


def simulate(scenario: Scenario, *, mode: str | None = None, on_step=None,
             keep_spans: int = 200_000, exact: bool = False, fault_baselines: bool = True) -> tuple[dict, Timeline]:
    """Run ``scenario`` in the simulator; returns (report dict, Timeline). The loss
    predicted at scale is added by the caller (:func:`oresearcher.sim.convergence.attach`),
    which runs proxies through this function.

    Symmetric ranks are simulated once per class (sim/symmetry.py) unless ``exact``;
    the report's ``engine`` section says how the run was done. Either way every other
    field is the same, byte for byte (tests/sim/test_scale.py). With faults, the report's
    ``faults`` section compares the run with baseline runs of the same scenario, simulated
    here (``fault_baselines=False``: a baseline run, no section of its own)."""
    mode = mode or resolve_mode(scenario)
    device, topo = build_cluster(scenario)
    faults = scenario.faults.active or scenario.faults.price_checkpoints
    classes, why = (None, "--exact") if exact else symmetry_classes(scenario, mode, device, faults or None)
    memory = memory_report(scenario, device)  # the report's and the checkpoints' (sim/faults.py) figures
    try:
        engine, tl = _run(scenario, mode, device, topo, on_step, keep_spans, classes, memory)
    except SymmetryBroken as e:
        log.info("symmetry broken (%s): one process per rank", e)
        classes, why = None, str(e)
        engine, tl = _run(scenario, mode, device, topo, on_step, keep_spans, None, memory)
    extra = {
        "mode": mode,
        "device": device.name,
        "fabric": {"intra_node": topo.intra.name, "inter_node": topo.inter.name if topo.inter else None},
        "ops_interpreted": engine.ops_done,
        "memory": memory,
    }
    if engine.faults is not None and fault_baselines:  # time lost per fault, work recomputed, goodput
        def baseline_total(keep):
            return simulate(variant(scenario, keep), mode=mode, keep_spans=0, fault_baselines=False)[0]["total_time_s"]

        extra["faults"] = fault_report(scenario, engine.faults, tl, baseline_total)
    extra["engine"] = {"symmetry": "classes" if classes else "per-rank", "why": why,
                       "processes": len(classes) if classes else scenario.world_size,
                       "ops_run": engine.ops_run}
    report = summarize(tl, scenario.resolved(), backend="sim", extra=extra)
    if device.prediction_band:  # a calibrated profile: how far a run on that host may land
        report["band"] = prediction_band(report, device.prediction_band)
    if fault_baselines and mode == "shape" and controlled(report):  # numeric runs (proxies, experiments) skip it
        report["without_controller"] = without_controller(scenario, mode)
    return report, tl


def prediction_band(report: dict, half_widths: dict) -> dict:
    """The band around the step time and the overhead (oresearcher/calibration/band.py)."""
    from oresearcher.reporting.compare import band

    return {"half_width": dict(half_widths),
            "step_time_s": list(band(report["step_time_s"], half_widths["step_time"])),
            "comm_overhead": list(band(report["comm_overhead"], half_widths["comm_overhead"]))}


def controlled(report: dict) -> bool:
    """The overhead controller decided in this run (its StepDone metrics carry budget_rung;
    a strategy without the cooperative program ignores communication.budget)."""
    return any("budget_rung" in m for ms in (report.get("metrics") or {}).values() for m in ms)


def _run(scenario, mode, device, topo, on_step, keep_spans, classes, memory):
    """(engine, timeline) of one run: a program per rank, or per class's first rank."""
    n = scenario.world_size
    reps = [c[0] for c in classes] if classes else range(n)
    torch_device = torch.device("meta") if mode == "shape" else torch.device("cpu")
    try:
        learners = [make_learner(scenario, r, mode=mode, device=torch_device) for r in reps]
        program = get_program(scenario.training.strategy)
    except ValueError as e:
        raise UserError(f"{getattr(scenario, '_source', scenario.name)}: {e}") from None
    ctxs = [AgentContext(rank=r, world_size=n, scenario=scenario, mode=mode, device=torch_device, profile=device)
            for r in reps]
    engine = Engine(topo, device, scenario.workload.dtype, scenario.communication.algorithm,
                    Timeline(n, keep_spans=keep_spans), seed=scenario.seed, pricing=compute_pricing(scenario, device))
    engine.on_step = on_step
    for c in ctxs:  # programs that time themselves (communication.budget) read simulated seconds
        c.clock = (lambda r: lambda: engine.now(r))(c.rank)
    engine.faults = fault_plan(scenario, device, ctxs, learners[0], memory)
    return engine, engine.run([program(c, l) for c, l in zip(ctxs, learners)], classes)
