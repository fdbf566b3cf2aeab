"""Hardware profiles: devices (compute, memory) and fabrics (links, protocol costs).

Profiles are YAML data files (``oresearcher/hardware/profiles/*.yaml``, one profile per document; a file
may hold several documents, as ``oresearcher.calibrate`` writes). Numbers in files carry
their unit in the field name; :func:`DeviceProfile` / :func:`FabricProfile` expose them
converted once to seconds, bytes and bytes/s.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from oresearcher.comm.units import GBps_to_Bps, us_to_s
from oresearcher.errors import UserError, short

PROFILE_DIR = Path(__file__).parent / "profiles"
# Numbers in profiles carry their unit in their name (bandwidth_GBps, latency_us); the
# properties below convert them once, through oresearcher.comm.units, to seconds and bytes/s.


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Finite(_Strict):
    """Every number finite (as in scenario files): a NaN or an infinite rate, latency or
    size only ever makes the simulator hang or report nonsense."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Ranges of profile numbers, wide around any real hardware (a CPU core to beyond the
# fastest accelerator): a value outside them is a typo or an attack, and at 1e-300 GB/s
# or 1e308 us the simulated clock stops advancing in floating point.
FlopRate = Annotated[float, Field(ge=1e3, le=1e18, allow_inf_nan=False)]  # FLOP/s
GBps = Annotated[float, Field(ge=1e-3, le=1e6, allow_inf_nan=False)]  # GB/s: 1 MB/s .. 1 PB/s
Micros = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]  # microseconds: up to a second
Fraction = Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)]


JITTER_CV_MAX = 2.0  # the widest compute spread a profile may give (calibrate caps what it measures)


class DeviceProfile(_Finite):
    kind: Literal["device"] = "device"
    name: str
    peak_flops: dict[Literal["fp32", "bf16", "fp16"], FlopRate] = Field(description="FLOP/s per dtype, dense")
    efficiency: float = Field(gt=0, le=1, description="fraction of peak reached in training")
    memory_bytes: float = Field(gt=0, le=1e15, description="device memory, bytes")
    host_overhead_us: Micros = Field(description="per Compute op fixed cost, microseconds")
    # A shared host's compute is not steady: each Compute op's duration is its mean times
    # a random factor (lognormal, mean 1) with this coefficient of variation. Ranks that
    # jitter independently wait for each other at every collective; 0 keeps every rank
    # identical and steady. `oresearcher.calibrate` measures it.
    compute_jitter_cv: float = Field(0.0, ge=0, le=JITTER_CV_MAX, description="std/mean of a Compute op's duration")
    # Slowness on a shared host persists: a rank slowed by a neighbour stays slow for a
    # few steps, so ranks drift apart between periodic averagings faster than independent
    # draws allow. With rho > 0 a rank's factor is drawn once per step (every Compute op
    # of the step shares it, so compute_jitter_cv is then the spread of a step) and its
    # logarithm follows an AR(1) over steps with this lag-1 correlation.
    compute_jitter_rho: float = Field(0.0, ge=0, lt=1, description="step-to-step correlation of a rank's slowness")
    # Ranks that block in a collective on a shared host get their cores back one after
    # another once the data is in: with this mean > 0 the first leaves at the end and each
    # other an exponential draw of this mean less the first's later, so ranks also drift
    # apart around short ops, which a spread in proportion to each op cannot give.
    # `oresearcher.calibrate` fits it to how much the ranks' times in the program's own
    # collectives differ.
    wake_delay_us: Micros = Field(0.0, description="mean of the exponential wake-up draws after a collective, us")
    # Checkpoints (sim/faults.py): a rank writes its state at this rate and a restarted rank
    # reads it back at it. 2 GB/s per GPU is an assumption (a node's NVMe or parallel file
    # system shared by 8 GPUs), not a measurement; a profile states its own.
    storage_bandwidth_GBps: float = Field(2.0, ge=1e-3, le=1e4, description="checkpoint write/read bandwidth per rank, GB/s")
    # Whether the device has streams: GPUs run a collective on a stream of its own beside
    # the compute stream. A CPU rank has none, and torch's FSDP2 then issues its
    # all-gathers and reduce-scatters synchronously (_fsdp_param_group.unshard_async_op is
    # False and foreach_reduce passes no async_op: torch 2.13), so they block the rank; the
    # fsdp program's cost model follows (oresearcher/programs/fsdp.py). Other programs'
    # async work handles overlap either way (gloo runs them on threads of its own).
    streams: bool = Field(True, description="collectives can run beside compute (GPU streams); false on CPUs")
    # An optimizer step over DTensor shards (torch's FSDP2) dispatches each elementwise op
    # through DTensor's Python layer: a fixed host cost per op, here per parameter per step
    # (step and zero_grad). `oresearcher.calibrate` measures it for the scenario's optimizer
    # (oresearcher/programs/fsdp_costs.py); 0: not priced.
    dtensor_param_step_us: float = Field(0.0, ge=0, le=1e6, description="host cost of one DTensor "
                                         "parameter's optimizer step beyond a plain tensor's, microseconds")
    # FSDP2's Python bookkeeping around each collective, per parameter of the unit: shards
    # collected for the copy-in and storages resized and viewed at the copy-out (per
    # all-gather); reduced shards viewed out and wrapped as DTensor gradients (per
    # reduce-scatter). Host work: charged on devices without streams. Calibrated; 0: not priced.
    fsdp_gather_param_us: float = Field(0.0, ge=0, le=1e6, description="FSDP2 bookkeeping per parameter "
                                        "per all-gather, microseconds (calibrated)")
    fsdp_reduce_param_us: float = Field(0.0, ge=0, le=1e6, description="FSDP2 bookkeeping per parameter "
                                        "per reduce-scatter, microseconds (calibrated)")
    # FSDP2's hooks (pre/post forward and backward, reshards) per unit per step, beyond its
    # collectives' bookkeeping: host work, charged without streams. Calibrated; 0: not priced.
    fsdp_unit_step_us: float = Field(0.0, ge=0, le=1e7, description="FSDP2 hooks per unit per step, "
                                     "microseconds (calibrated)")
    # A plain optimizer step (and zero_grad) per parameter element, on this device's host
    # loop (torch.optim on CPU); the fsdp schedule charges its shards' step at it where it
    # prices the passes at pass_flops_per_s (which leaves the optimizer out). 0: not priced.
    optimizer_element_ns: float = Field(0.0, ge=0, le=1e6, description="plain optimizer step per parameter "
                                        "element, nanoseconds (calibrated)")
    # The FLOP rate of a model's forward and backward alone, where a calibrated rate folds
    # in its program's other work (a ddp step's gradient packing and full optimizer step,
    # which FSDP2 does not do); the fsdp schedule prices its passes at it. None: the rate.
    pass_flops_per_s: Optional[FlopRate] = Field(None, description="FLOP/s of forward and backward "
                                              "alone (calibrated), for the fsdp schedule")
    # The roofline model (sim/roofline.py): each traced kernel costs max(FLOPs / achievable
    # rate, bytes / memory bandwidth) + launches. "flat" (the default) keeps FLOPs /
    # (peak x efficiency) + host overhead per Compute op; profiles without these fields are flat.
    compute_model: Literal["flat", "roofline"] = Field("flat", description="how Compute ops are priced")
    memory_bandwidth_GBps: Optional[GBps] = Field(None, description="device memory bandwidth, GB/s")
    memory_efficiency: float = Field(1.0, gt=0, le=1, description="achievable fraction of memory_bandwidth_GBps")
    launch_us: Optional[Micros] = Field(None, description="per kernel launch, microseconds")
    achievable: Optional[dict[Literal["matmul", "attention", "vector"], float]] = Field(
        None, description="achievable fraction of peak_flops per op class")
    foreach_optimizer: bool = Field(True, description="optimizer runs torch's foreach kernels (CUDA); CPUs loop")
    # Hosted agents (cooperation.allocation.agents_per_device > 1) switch by moving their
    # state between device and host memory over this link (sim/swap.py); a profile states
    # its source. None: the profile cannot price a switch.
    host_link_GBps: Optional[float] = Field(None, ge=1e-3, le=1e5, description="host<->device copy bandwidth, GB/s "
                                            "per direction")
    # How far a run on the calibrated host may land from a prediction made with this profile,
    # as relative half widths (oresearcher/calibration/band.py: from calibration's own repeats).
    # None: no band (a shipped profile, or too few steps measured).
    prediction_band: Optional[dict[Literal["step_time", "comm_overhead"], Annotated[float, Field(ge=0, le=10)]]] = Field(
        None, description="relative half widths of a prediction's band (calibrated)")

    @model_validator(mode="after")
    def _roofline_complete(self):
        if self.compute_model == "roofline" and not self.has_roofline:
            raise ValueError("compute_model roofline needs memory_bandwidth_GBps, launch_us and "
                             "achievable (matmul, attention)")
        for k, v in (self.achievable or {}).items():
            if not 0 < v <= 1:
                raise ValueError(f"achievable.{k} must be in (0, 1], got {v}")
        return self

    @property
    def has_roofline(self) -> bool:
        return (self.memory_bandwidth_GBps is not None and self.launch_us is not None
                and self.achievable is not None and {"matmul", "attention"} <= set(self.achievable))

    @property
    def memory_bandwidth(self) -> float:
        """Achievable bytes/s of device memory."""
        return GBps_to_Bps(self.memory_bandwidth_GBps) * self.memory_efficiency

    @property
    def launch_s(self) -> float:
        return us_to_s(self.launch_us)

    def flops_per_s(self, dtype: str) -> float:
        """Achieved FLOP/s for ``dtype`` (peak x efficiency)."""
        peak = self.peak_flops.get(dtype) or self.peak_flops.get("fp32")
        if not peak or peak <= 0:
            raise UserError(f"device profile {self.name}: no positive peak_flops for {dtype}")
        return peak * self.efficiency

    @property
    def host_overhead_s(self) -> float:
        return us_to_s(self.host_overhead_us)


Proto = Literal["LL", "LL128", "Simple"]


class NcclParams(_Strict):
    """How NCCL runs collectives on this fabric (see :mod:`oresearcher.comm.nccl`); per
    protocol tables are keyed LL, LL128, Simple. Values come from NCCL's tuning.cc /
    enqueue.cc unless the profile's comment names a measurement."""

    channels: int = Field(ge=1, le=64, description="ring channels NCCL builds")
    threads: dict[Proto, Annotated[int, Field(ge=1, le=4096)]] = Field(description="threads per channel at full size")
    thread_threshold: dict[Proto, Annotated[int, Field(ge=1, le=2**30)]] = Field(
        description="bytes per thread before a channel is added")
    saturating_threads: int = Field(ge=1, le=4096, description="threads a channel needs for its full rate")
    base_latency_us: dict[Proto, Micros] = Field(description="ring start-up latency, microseconds")
    tree_base_latency_us: dict[Proto, Micros] = Field(description="tree start-up latency, microseconds")
    ring_hop_latency_us: dict[Proto, Micros] = Field(description="per ring step on this fabric, microseconds")
    tree_hop_latency_us: dict[Proto, Micros] = Field(description="per tree level on this fabric, microseconds")
    channel_GBps: dict[Proto, GBps] = Field(description="bus bandwidth one channel (thread block) copies, GB/s")
    tuner_channel_GBps: dict[Proto, Annotated[float, Field(ge=1e-3)]] = Field(
        description="per-channel ceiling NCCL's tuner assumes, GB/s (.inf: none)")
    tree_busbw_cap_GBps: dict[Proto, GBps] = Field(description="tree bus-bandwidth ceiling, GB/s")
    tree_correction: dict[Proto, list[Fraction]] = Field(description="tree bandwidth factor by log2(bytes/64)")
    kernel_overhead_us: Micros = Field(description="per collective kernel, beyond the tuner's latency, microseconds")
    launch_us: Micros = Field(description="one kernel launch when one process drives all GPUs, microseconds")
    p2p_ll_threshold_bytes: int = Field(16384, ge=0, description="send/recv per peer up to this size use LL")
    # NVLS (NVLink SHARP): an NVSwitch-3 fabric reduces in the switch (oresearcher/comm/nccl.py). Absent:
    # the fabric has no NVLS (A100's NVSwitch 2, PCIe).
    nvls_channels: Optional[int] = Field(None, ge=1, le=64, description="channels NCCL runs NVLS on "
                                         "(NCCL_NVLS_NCHANNELS); absent: no NVLS")
    nvls_latency_us: Micros = Field(0.0, description="NVLS start-up in NCCL's tuner table, microseconds")

    @property
    def kernel_overhead_s(self) -> float:
        return us_to_s(self.kernel_overhead_us)

    @property
    def launch_s(self) -> float:
        return us_to_s(self.launch_us)


class NcclNetParams(_Finite):
    """NCCL's per-step latencies across the network (tuning.cc hwLat, NET row)."""

    ring_hop_latency_us: dict[Proto, Micros]
    tree_hop_latency_us: dict[Proto, Micros]
    # What one channel moves across the network, per protocol (GB/s), with its source; a
    # channel that crosses nodes moves at the slower of this and the node's channel rate
    # (oresearcher/comm/nccl_tier.py). Absent: the node's channel rates alone.
    channel_GBps: Optional[dict[Proto, GBps]] = Field(None, description="bus GB/s one channel moves "
                                                      "across the network")
    # Set by the topology, not in profiles: LL128 may cross this network only where the
    # GPU-to-NIC path is at most PXB (oresearcher/comm/pcie.py).
    ll128: bool = Field(True, description="LL128 may cross the network (set from the node's PCIe layout)")
    # NVLS-tree's step across the network (Simple); absent: NVLS-tree does not run over it.
    nvls_tree_hop_latency_us: Optional[Micros] = Field(None, description="NVLS-tree step across the "
                                                       "network, microseconds")


class FabricProfile(_Finite):
    kind: Literal["fabric"] = "fabric"
    name: str
    topology: Literal["switch", "pcie", "network"]
    bandwidth_GBps: GBps = Field(description="GB/s per direction per port (GB = 1e9 bytes)")
    efficiency: float = Field(gt=0, le=1, description="achievable fraction of bandwidth_GBps")
    shared_bandwidth_GBps: Optional[GBps] = Field(None, description="pcie: shared host bridge, GB/s")
    base_latency_us: Micros = Field(description="per collective, microseconds")
    hop_latency_us: Micros = Field(description="per algorithm step, microseconds")
    call_overhead_us: Micros = Field(description="per collective call on the host, microseconds")
    # How the collective library runs a reduce-scatter. gloo has no reduce-scatter kernel
    # for torch's reduce_scatter_tensor: ProcessGroupGloo clones the input, all-reduces the
    # whole of it and copies this rank's slice out (torch.profiler shows gloo:all_reduce,
    # aten::clone and aten::copy_ inside c10d::_reduce_scatter_base_; torch 2.13).
    # "all_reduce" prices it so: an all-reduce of the input, 2(n-1)/n of it on the wire.
    reduce_scatter: Literal["native", "all_reduce"] = Field(
        "native", description="native, or all_reduce: the library runs reduce-scatter as an all-reduce (gloo)")
    # Inside a node: NCCL's protocol model (absent: the plain alpha-beta model above).
    nccl: Optional[NcclParams] = None
    # Between nodes: NCCL's network step latencies.
    nccl_net: Optional[NcclNetParams] = None

    @property
    def bandwidth(self) -> float:
        """Achievable bytes/s per direction per port."""
        return GBps_to_Bps(self.bandwidth_GBps) * self.efficiency

    @property
    def shared_bandwidth(self) -> Optional[float]:
        return None if self.shared_bandwidth_GBps is None else GBps_to_Bps(self.shared_bandwidth_GBps) * self.efficiency

    @property
    def base_latency(self) -> float:
        return us_to_s(self.base_latency_us)

    @property
    def hop_latency(self) -> float:
        return us_to_s(self.hop_latency_us)

    @property
    def call_overhead(self) -> float:
        return us_to_s(self.call_overhead_us)


def _parse(doc, source: str):
    if not isinstance(doc, dict):
        raise UserError(f"{source}: a profile must be a mapping, got {type(doc).__name__}")
    from .node import NodeLayout  # a node's PCIe layout (hardware/node.py)

    model = {"device": DeviceProfile, "fabric": FabricProfile, "node": NodeLayout}.get(doc.get("kind"))
    if model is None:
        raise UserError(f"{source}: kind: must be 'device', 'fabric' or 'node' (got {doc.get('kind')!r})")
    try:
        return model.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise UserError(f"{source}: {str(doc.get('name', '?'))[:60]}.{loc}: {err['msg']} "
                        f"(got {short(err.get('input'), 80)})") from None


def load_profile_file(path: str | Path) -> list:
    """All profiles in one YAML file (several documents allowed)."""
    from oresearcher.yamlsafe import read_all  # a scenario's limits: size, aliases, depth, duplicate keys

    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such profile file")
    return [_parse(d, str(p)) for d in read_all(p)]


@lru_cache(maxsize=None)
def builtin_profiles() -> dict:
    out = {}
    for f in sorted(PROFILE_DIR.glob("*.yaml")):
        for prof in load_profile_file(f):
            out[(prof.kind, prof.name)] = prof
    return out


def add_profiles(cat: dict, profiles: list, source: str) -> None:
    """Add a user's ``profiles`` (from ``source``) to ``cat``. A name that is a shipped
    profile's, or one that appears twice, is refused: which of two numbers a scenario
    ran on would otherwise depend on file order, and a shipped name would silently
    stand for other hardware in every report."""
    shipped = builtin_profiles()
    for prof in profiles:
        key = (prof.kind, prof.name)
        if key in shipped:
            raise UserError(f"{source}: {prof.kind} profile {prof.name!r} is the name of a shipped profile; "
                            f"give yours its own name (e.g. {prof.name}-calibrated)")
        if key in cat:
            raise UserError(f"{source}: a second {prof.kind} profile named {prof.name!r}; each name once")
        cat[key] = prof


def profile_path(f: str | Path, base_dir: Path) -> Path:
    """Where a listed profile file is: as given when absolute, else under ``base_dir``."""
    return Path(f) if Path(f).is_absolute() else base_dir / f


def catalogue(extra_files=(), base_dir: Path = Path("."), missing_ok: bool = False) -> dict:
    """Built-in profiles plus those in ``extra_files`` (relative to ``base_dir``). A listed
    file that is not there is a UserError, or with ``missing_ok`` skipped (the scenario
    check at load time, where the simulator reports it later)."""
    cat = dict(builtin_profiles())
    for f in extra_files:
        path = profile_path(f, base_dir)
        if missing_ok and not path.is_file():
            continue
        add_profiles(cat, load_profile_file(path), str(path))
    return cat


def lookup(cat: dict, kind: str, name: str, where: str):
    """The profile called ``name``. A device name may end in ``:roofline`` or ``:flat`` to
    choose its compute model (``cluster.device=H200:roofline``)."""
    name, _, model = name.partition(":") if kind == "device" else (name, "", "")
    prof = cat.get((kind, name))
    if prof is None:
        known = ", ".join(sorted(n for k, n in cat if k == kind))
        raise UserError(f"{where}: unknown {kind} profile {name!r} (known: {known})")
    if model:
        if model not in ("flat", "roofline"):
            raise UserError(f"{where}: {name}:{model}: the compute model after ':' must be flat or roofline")
        try:
            prof = DeviceProfile.model_validate({**prof.model_dump(), "compute_model": model})
        except ValidationError as e:
            raise UserError(f"{where}: {name}:{model}: {e.errors()[0]['msg']}") from None
    return prof
