"""Real fsdp runs: :mod:`.learner` (torch's fully_shard per block, a learner the programs
use like any other), :mod:`.comm` (FSDP2's own collectives timed into the report) and
:mod:`.guard` (non-finite gradients stopped before the reduce-scatter shares them)."""
