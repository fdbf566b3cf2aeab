"""Run the agent programs for real, on torch.distributed (gloo on CPUs, NCCL on GPUs).

    # one machine: starts one local process per agent itself
    python -m oresearcher.run --backend=gloo --scenario scenarios/local-gloo.yaml
    python -m oresearcher.run --backend=gloo --scenario scenarios/local-gloo.yaml \\
        --num_agents=4 --strategy=local_sgd --local_steps=10 --steps=200 --checkpoint_every=50
    # the reference command on 8 GPUs
    python -m oresearcher.run --backend=nccl --scenario scenarios/8xA100.yaml --num_agents=8 \\
        --communication_interval=100 --reward_weights=0.5,0.3,0.2 --strategy=oresearcher
    # several machines: torchrun starts the ranks, this joins them
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        -m oresearcher.run --backend=nccl --scenario scenarios/8xA100.yaml --num_agents=16
    # continue a stopped run from its last complete checkpoint (a finished run: a no-op)
    python -m oresearcher.run --resume runs/local-gloo/gloo --steps=400
    # ... changing what it trains on purpose (refused without --override)
    python -m oresearcher.run --resume runs/local-gloo/gloo --lr=0.01 --override

Writes ``<out>/report.json`` (rank 0; the simulator's schema, see
:mod:`oresearcher.reporting.report`), TensorBoard runs under ``<out>/tensorboard`` and, with
``--checkpoint_every``, per-rank checkpoints under ``<out>/checkpoints``. Flags override
the scenario's fields; ``--set path.to.field=value`` reaches any other field. The command
is :mod:`oresearcher.backends.run.command` (launch, join, outcome) over
:mod:`oresearcher.backends.run.flags` (flags, scenario loading).
"""
from oresearcher.backends.run.command import main  # noqa: F401

if __name__ == "__main__":
    from oresearcher.backends.run.worker import entry_point

    entry_point(main)
