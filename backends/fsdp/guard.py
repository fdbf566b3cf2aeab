"""Divergence under FSDP2: a rank's gradients are checked before its reduce-scatter shares them.

FSDP2 reduce-scatters each unit's gradients from a post-backward hook, inside
``loss.backward()``, so a check after backward would see them already averaged into
every rank's shard (one rank's NaN in everyone's). :class:`CheckedReduceScatter` takes
the place of FSDP's default reduce-scatter (``FSDPModule.set_custom_reduce_scatter``, a
public hook) and looks at the flat input buffer first: if it holds a NaN or an infinity,
the rank's contribution to that unit is zeroed before it leaves, and the rank remembers
it. No host sync during backward: the check and the zeroing stay on the device (a 0-d
flag and ``masked_fill_``); the program reads the flag once, after backward
(:func:`oresearcher.programs.divergence.sharded_forward_backward`), and acts on
``training.on_divergence``.
"""
from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter


class CheckedReduceScatter(DefaultReduceScatter):
    """FSDP's default reduce-scatter, with this rank's input checked and, if non-finite, zeroed."""

    def __init__(self):
        self.flag = None  # 0-d bool on the device: some input since the last take() was non-finite

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        ends = torch.stack([input_tensor.amax(), input_tensor.amin()])  # NaN propagates; +-inf are ends
        bad = ~torch.isfinite(ends).all()
        input_tensor.masked_fill_(bad, 0)
        self.flag = bad if self.flag is None else self.flag | bad
        return super().__call__(output_tensor, input_tensor, group, op, async_op)

    def take(self) -> bool:
        """Was any input non-finite since the last call? (one host sync)"""
        flag, self.flag = self.flag, None
        return bool(flag) if flag is not None else False


def install(model) -> CheckedReduceScatter:
    """One checked reduce-scatter for every fully_shard unit of ``model``."""
    comm = CheckedReduceScatter()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(comm)
    return comm
