"""The ``cluster`` section of a scenario, and its device and fabric names checked against
the hardware profiles at load time.

Profiles are the YAML documents of ``oresearcher/hardware/profiles/`` plus the scenario's
``cluster.profile_files`` (for instance what ``python -m oresearcher.calibrate`` wrote),
looked up as the simulator looks them up (:func:`oresearcher.hardware.lookup`; a
device name may end in ``:roofline`` or ``:flat``). :func:`check_profiles` runs in
:func:`oresearcher.scenario.load_scenario`, so a misspelt ``cluster.device`` or fabric
fails in ``python -m oresearcher.sim`` and ``python -m oresearcher.run`` alike, before
anything runs, with one line listing the valid names. (The hardware module is pydantic
and YAML only: no SimPy is imported here.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import Field, model_serializer, model_validator

from .network import NetworkSpec
from .types import MAX_WORLD, Int, Name, Strict


class ClusterSpec(Strict):
    nodes: Int = Field(1, ge=1, le=4096, description="number of nodes")
    gpus_per_node: Int = Field(8, ge=1, le=64, description="accelerators (or CPU ranks) per node")
    device: Name = Field("A100-SXM4-80GB", description="device profile name (oresearcher/hardware/profiles or "
                         "profile_files; NAME:roofline or NAME:flat picks the compute model)")
    intra_node: Name = Field("nvswitch-a100", description="fabric profile inside a node")
    inter_node: Optional[Name] = Field(None, description="fabric profile between nodes (NICs + switch)")
    nics_per_node: Int = Field(1, ge=1, le=64, description="network cards per node on inter_node")
    # The node's PCIe layout (a `kind: node` profile) and NCCL_NET_GDR_LEVEL: which GPUs and
    # NICs share a PCIe switch decides GPUDirect RDMA and LL128 across nodes (oresearcher/comm/pcie.py).
    node_layout: Optional[Name] = Field(None, description="node PCIe layout profile (GPUs and NICs per PCIe "
                                        "switch, uplinks); none: each GPU's NIC under its switch, GPUDirect RDMA on")
    gdr_level: Literal["LOC", "PIX", "PXB", "PHB", "SYS"] = Field(
        "PXB", description="GPUDirect RDMA up to this GPU-to-NIC path type, as NCCL_NET_GDR_LEVEL (default PXB)")
    network: Optional[NetworkSpec] = Field(None, description="switch tiers between the NICs (oresearcher/scenario/network.py); "
                                           "none: one non-blocking switch")
    profile_files: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list, max_length=16,
        description="extra profile YAML files (e.g. from `oresearcher.calibrate`), relative to the scenario",
    )

    @model_serializer(mode="wrap")
    def _leave_out_default_pcie(self, handler):
        # a cluster that names no PCIe layout dumps as before the layout existed, so the
        # reports of scenarios without one stay byte for byte what they were
        data = handler(self)
        if isinstance(data, dict) and data.get("node_layout") is None and data.get("gdr_level") == "PXB":
            data.pop("node_layout", None)
            data.pop("gdr_level", None)
        return data

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @model_validator(mode="after")
    def _multi_node_needs_fabric(self):
        if self.world_size > MAX_WORLD:
            raise ValueError(f"nodes x gpus_per_node = {self.world_size} is more than {MAX_WORLD} ranks")
        if self.nodes > 1 and not self.inter_node:
            raise ValueError("a cluster with more than one node needs cluster.inter_node")
        if self.network is not None:
            from ..comm.tiers import check_tiers

            why = check_tiers(self.network.kind, self.network.tiers, self.nodes)
            if why:
                raise ValueError(why)
        return self


def check_profiles(cluster: ClusterSpec, source: str, base_dir: Path, who=None) -> None:
    """UserError naming the field and the known names when ``cluster.device``,
    ``intra_node`` or ``inter_node`` is no profile (or a device's ``:model`` suffix is
    wrong). A listed profile file that is not there is left to the simulator, which
    reports it, and a name it could hold is not judged: the saved copy of a run
    (``runs/.../scenario.yaml``) keeps the relative paths of the scenario it came from.
    ``who(field)``: the override that wrote ``field``, named instead of the file."""
    from ..hardware import catalogue, lookup, profile_path

    cat = catalogue(cluster.profile_files, base_dir, missing_ok=True)
    missing = any(not profile_path(f, base_dir).is_file() for f in cluster.profile_files)
    tiers = [(f"network.tiers[{i}].fabric", t.fabric) for i, t in enumerate(cluster.network.tiers)] \
        if cluster.network else []
    named = [(k, f, getattr(cluster, f)) for k, f in (
        ("device", "device"), ("fabric", "intra_node"), ("fabric", "inter_node"), ("node", "node_layout"))]
    for kind, field, name in named + [("fabric", *t) for t in tiers]:
        if name is None or (missing and (kind, name.partition(":")[0] if kind == "device" else name) not in cat):
            continue
        where = (who and who(f"cluster.{field}")) or source
        lookup(cat, kind, name, f"{where}: cluster.{field}")  # raises the one line
