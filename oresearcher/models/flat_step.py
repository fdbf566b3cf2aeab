"""One step shared by the distillation students (:mod:`oresearcher.cooperation.distill`,
:mod:`oresearcher.tasks.text.distill`): their gradients flattened for the AllReduce and the
averaged tensor applied back."""
from __future__ import annotations

import torch

from ..ops import AllReduce, Compute


class FlatGradStep:
    """A student's step between its backward and its optimizer: its gradients as one flat
    tensor for the AllReduce, and the averaged tensor applied back (clipped to a global
    norm of ``clip`` when set). Needs ``self.module`` and ``self.opt``."""

    clip = None

    def flat_grad(self) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.module.parameters()])

    def apply(self, flat: torch.Tensor) -> None:
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.module.parameters()])
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
        self.opt.step()

    def averaged_update(self):
        """The step's ops after the student's forward-backward: its gradients packed,
        averaged over the ranks (``distill_grad``) and applied; yields ops."""
        grad = yield Compute(self.flat_grad, name="pack")
        grad = yield AllReduce(grad, op="avg", name="distill_grad")
        yield Compute(self.apply, grad, flops=10.0 * grad.numel(), name="optimizer")
