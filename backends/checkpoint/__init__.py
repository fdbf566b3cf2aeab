"""Checkpoints of a real run: :mod:`.per_rank` (each rank's own atomic file and manifest,
resuming from the newest step every rank completed) and :mod:`.dcp` (fsdp's model and
optimizer shards through torch.distributed.checkpoint, beside the rank files)."""
