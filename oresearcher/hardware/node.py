"""A node's PCIe layout: which GPUs and NICs share a PCIe switch, and the switch's uplink.

A ``kind: node`` profile (``oresearcher/hardware/profiles/*.yaml``) describes one server
model as its vendor documents it, with the document in ``source``: never read off a
measured collective curve. The layout decides what NCCL does across nodes
(:mod:`oresearcher.comm.pcie`): the GPU-to-NIC path type (``nvidia-smi topo -m``'s
PIX / PXB / PHB / SYS), whether GPUDirect RDMA is on, whether LL128 may cross the
network, and, where traffic goes through host memory, which uplinks it shares.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from oresearcher.comm.units import GBps_to_Bps

SwitchPath = Literal["PIX", "PXB"]
GdrLevel = Literal["LOC", "PIX", "PXB", "PHB", "SYS"]


class PcieSwitch(BaseModel):
    """One PCIe switch complex below a CPU root port: the devices under it and its uplink."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cpu: int = Field(ge=0, le=7, description="CPU socket whose root port the uplink joins")
    gpus: list[Annotated[int, Field(ge=0, le=63)]] = Field(default_factory=list, max_length=64)
    nics: list[Annotated[int, Field(ge=0, le=63)]] = Field(default_factory=list, max_length=64)
    path: SwitchPath = Field("PIX", description="GPU-to-NIC path inside this complex: PIX (one switch) "
                             "or PXB (through several switches, no host bridge)")
    uplink_GBps: float = Field(ge=1e-3, le=1e4, description="switch-to-CPU link, GB/s per direction, "
                               "after line encoding")


class NodeLayout(BaseModel):
    """A server's PCIe layout (see the module docstring)."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["node"] = "node"
    name: str
    source: str = Field(min_length=10, description="the vendor document the layout is taken from")
    gpus: int = Field(ge=1, le=64)
    nics: int = Field(ge=1, le=64)
    switches: list[PcieSwitch] = Field(min_length=1, max_length=64)
    # What a PCIe link carries of its rate: 256-byte payloads behind 24 bytes of TLP header,
    # sequence number, LCRC and framing (PCIe base spec 4.0, 2.2 / 4.2): 256 / 280.
    pcie_efficiency: float = Field(256 / 280, gt=0, le=1, description="payload fraction of a PCIe link")
    gdr: bool = Field(True, description="the NICs and driver support GPUDirect RDMA (nvidia-peermem)")

    @model_validator(mode="after")
    def _every_device_once(self):
        for what, count in (("gpus", self.gpus), ("nics", self.nics)):
            seen = sorted(i for s in self.switches for i in getattr(s, what))
            if seen != list(range(count)):
                raise ValueError(f"switches must list each of {what} 0..{count - 1} exactly once, got {seen}")
        return self

    def switch_of(self, what: str, index: int) -> int:
        """Index in ``switches`` of the complex holding GPU or NIC ``index`` (what: gpus, nics)."""
        return next(k for k, s in enumerate(self.switches) if index in getattr(s, what))

    def uplink_Bps(self, switch: int) -> float:
        """Achievable bytes/s per direction of a switch's uplink."""
        return GBps_to_Bps(self.switches[switch].uplink_GBps) * self.pcie_efficiency
