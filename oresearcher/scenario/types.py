"""The building blocks every section of a scenario shares: ranges, number types that refuse
true/false, names, the strict base model, and the strategy and algorithm vocabularies (the
algorithms' names are the communication room's, :data:`oresearcher.comm.ALGORITHM_CHOICES`).
:mod:`oresearcher.scenario` assembles the sections; this module has no section of its own."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, PlainSerializer, PlainValidator

from ..strict import Float, Int, Strict  # noqa: F401 (every section's number types and base)
# the collective algorithms a scenario may ask for: the communication room's names, and auto
from ..comm import ALGORITHM_CHOICES as ALGORITHMS  # noqa: F401 (communication.algorithm's vocabulary)

MAX_WORLD = 16384  # ranks (nodes x gpus_per_node, agents): the largest clusters trained on today
MAX_STEPS = 10**7
MAX_BATCH = 2**20  # sequences per step
MAX_SEQ = 2**20  # tokens per sequence
MAX_SEED = 2**32 - 1
MAX_NAME = 100  # characters of a device, fabric or model name
SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]


def _codec_spec(v):
    from ..codecs.spec import parse  # the codec library is the one authority on spec strings (imports torch)

    if isinstance(v, str) and len(v) > 200:
        raise ValueError("a codec spec is at most 200 characters")
    return parse(v)  # ValueError names the bad part


# workload.options: a mapping in the file, the task's own options model once validated (its Task declares it)
TASK_OPTIONS = "mapping (the task's options)"  # how the scenario reference names its type
TaskOptions = Annotated[Any, TASK_OPTIONS]

if TYPE_CHECKING:
    from ..codecs.spec import CodecSpec as CodecField
else:  # parsed once, here: a CodecSpec inside, its text in dumps (reports, saved scenarios)
    CodecField = Annotated[Any, PlainValidator(_codec_spec), PlainSerializer(str, return_type=str)]

# asked for by name, answered by another strategy: (strategy, why)
STRATEGY_ALIASES = {
    "colossalai": ("fsdp", "ColossalAI pins torch <= 2.5.1 and cannot be installed beside this torch; "
                   "torch's own FSDP2 (fully_shard) gives the same ZeRO-3 sharding"),
}


def strategy_alias_error(name, flag: str = "strategy ") -> str | None:
    """One line saying which strategy ``name`` maps to and why, or None for other names."""
    if not isinstance(name, str) or name.lower() not in STRATEGY_ALIASES:
        return None
    target, why = STRATEGY_ALIASES[name.lower()]
    return f"{flag}{name} maps to {target}: {why}; use {flag}{target}"
