"""The cooperative O-Researcher program: roles, fusion rounds, rewards, resource shares.

``cooperative(ctx, learner)`` is one agent's generator of ops (training.strategy =
"oresearcher"); the same code runs in the simulator and on torch.distributed. Training
is cut into rounds of ``communication.interval`` steps. A round:

1. Local steps (how many: this agent's share of the round's compute, see
   :mod:`oresearcher.cooperation.allocation`); its role shapes them (:mod:`oresearcher.cooperation.roles`):
   explorer lr x scale, optimizer SAM (one Compute charged 2x) or SWA, validator plain.
   Every ``share_every`` steps agents of one architecture average gradients (AllReduce,
   or the codec's exchange when ``communication.codec`` is set), for as many steps as
   every member of the group takes this round, so the collectives always pair up.
   With ``cooperation.privacy`` every step's gradient is DP-SGD's, noised by the agent
   before the codec sees it (:mod:`oresearcher.cooperation.privacy`); with ``cooperation.replay``
   every ``sync_every`` steps (as many as every agent takes) one AllGather shares new rows
   and priorities of the group's replay pool (:mod:`oresearcher.cooperation.replay_sharing`).
2. AllGather of every agent's flat parameters (zero-padded to the largest model, so
   architectures can differ): one message serves the validators and the fusion.
3. Validators evaluate every agent on held-out data (``learner.evaluate_params``) and
   everyone AllGathers a small score tensor (:func:`oresearcher.cooperation.roles.encode_report`).
4. Every rank computes the same decisions from the same gathered numbers, so no further
   messages are needed: rewards (:mod:`oresearcher.tasks.rewards`, scheduled weights),
   attention fusion weights per architecture group (:mod:`oresearcher.cooperation.fusion`, flagged
   agents get 0), the new roles with their reasons, PBT exploit/explore, the next
   round's local steps. Then each agent sets its own fused (or exploited, or noised)
   parameters; an optional outer Nesterov step acts on the fusion pseudo-gradient.

After the last round the final parameters are gathered and scored once more, so the
agents and their validator scores are ready for the final fusion into one model; they
are left in ``learner.cooperative_result``. Role switches are logged with their reason
and reported in StepDone metrics ("role" is the code in :data:`oresearcher.cooperation.roles.ROLE_CODES`,
"role_switch" the reason string).

The round is one object, :class:`oresearcher.programs.cooperative_round.Round`: a
pipeline with one hook per mechanism (roles, gradient sharing with privacy, fusion,
replay, rewards, allocation, overhead control, the outputs' ensemble; distillation
follows in :mod:`oresearcher.programs.distill`), each mechanism a module switched by the
scenario, not by a code path (:data:`~oresearcher.programs.cooperative_round.MECHANISMS`).

Resuming (see :mod:`oresearcher.programs`): a round's end is the only resume boundary.
Its StepDone is marked as nominal step ``sum(rounds[:r+1]) - 1`` -- the same on every
rank although agents take different numbers of local steps -- and a checkpoint due
mid-round is written at the end of that round. Registered state: "group" (roles, lr
multipliers, reward history), "allocation", "swa", "outer", "loop" (next round, this
rank's StepDone counter, the next round's planned steps), the codec, "privacy" (noise
generator, steps accounted) and "replay" (this agent's replica of the pool).

What the program asks of a learner beyond the Learner interface (all optional; shape
mode and foreign tasks fall back to training-loss scores): ``evaluate_params(flat, arch)``
-> dict(metric in [0, 1], loss, calibration, safety, probs, flops), ``arch_numel(arch)``,
``set_exploration(scale)``, ``set_reward_weights(w)``, ``set_peers([(arch, flat)])`` (the
other healthy agents' gathered parameters, for a reward-shaped loss; only with
``cooperation.rewards.shape_loss``); and for SAM and per-agent learning
rates the TorchLearner attributes ``module``, ``loss_fn``, ``batches``, ``optimizer``.
"""
from __future__ import annotations

from .cooperative_hosted import hosted_program
from .cooperative_round import Round


def cooperative(ctx, learner):
    """O-Researcher: cooperative training of ``ctx.world_size`` agents (see module doc)."""
    if ctx.scenario.cooperation.allocation.agents_per_device > 1:  # several agents per rank, device time by shares
        return (yield from hosted_program(ctx, learner))
    return (yield from Round(ctx, learner).run())
