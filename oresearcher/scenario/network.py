"""The ``cluster.network`` section: the switches between the nodes' NICs.

Without it the NICs meet in one non-blocking switch (every cross-node transfer crosses
only its two NICs). With it they meet in a fat tree of ``len(tiers) + 1`` switch tiers:
``tiers`` lists every tier but the top one, from the leaves up, each with how many
children a switch has, how much less capacity its uplinks have than its downlinks, and
the link profile of those uplinks; the top tier joins the last listed tier's switches
without blocking. ``kind: rail-optimised`` gives every NIC rail (local NIC k of every
node) its own leaf in each group of nodes, as rail-optimised GPU clusters are cabled
(NVIDIA DGX SuperPOD reference architecture): same-rail traffic stays in its leaf,
cross-rail traffic climbs to the spine. Prices in :mod:`oresearcher.comm.tiers`.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from .types import Float, Int, Name, Strict


class TierSpec(Strict):
    group: Int = Field(ge=1, le=4096, description="children per switch: nodes per leaf at the first tier (rail-"
                       "optimised: nodes per rail group), switches of the tier below per switch above")
    oversubscription: Float = Field(1.0, ge=1.0, le=64.0, description="a switch's downlink over its uplink "
                                    "capacity (1: non-blocking)")
    fabric: Optional[Name] = Field(None, description="fabric profile of this tier's uplinks (their bandwidth per "
                                   "port); default cluster.inter_node")


class NetworkSpec(Strict):
    kind: Literal["fat-tree", "rail-optimised"] = Field("fat-tree", description="one leaf per group of nodes, or "
                                                        "one leaf per NIC rail per group of nodes")
    tiers: list[TierSpec] = Field(min_length=1, max_length=4, description="switch tiers below the top, leaves first")
