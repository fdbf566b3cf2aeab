"""text: GPT-2-shaped language models on public-domain English; pretrain, clone, cooperate, distil.

    python -m oresearcher.sim scenarios/text-4.yaml                         # four agents really train (CPU)
    python -m oresearcher.run --backend=gloo --scenario scenarios/text-4.yaml --export runs/text-4/model

The flow the seed describes, on two corpora of different domains (:mod:`.corpora`: the State
of the Union addresses, ``sotu``, and the King James Bible, ``bible``):

1. Pretrain a base on the first corpus (:mod:`.pretrain`; ``options.init: pretrain`` finds it
   in the cache or trains it there once; ``init: PATH`` starts from a checkpoint directory).
2. Clone it into the agents, made heterogeneous by the seed (data order, dropout, learning
   rate, role; :mod:`.learner`).
3. Cooperate on the second corpus (``training.strategy: oresearcher``: gradient sharing,
   validator-scored attention fusion, roles; :mod:`oresearcher.programs.cooperative`).
4. Distil the final agents into one deployable model (``distill.student``; :mod:`.distill`),
   which ``run --export`` writes as a Hugging Face GPT-2 directory (:mod:`.hf`).

Models (``workload.model``): ``text-6k`` ... ``text-1.5m`` (:data:`MODELS`,
:data:`oresearcher.models.PRESETS`: pre-LN blocks, learned positions, tanh GELU, tied
embeddings; 128-token context; named by non-embedding parameters). Shape mode prices the
same presets on the meta device. Scores: validation loss in nats/token and bits/byte, and the
multiple-choice benchmark's accuracy (:mod:`.evaluation`, :mod:`.mcq`). Data: :mod:`.data`.
"""
from __future__ import annotations

from ..spec import Task
from .options import TextOptions

MODELS = ("text-6k", "text-12k", "text-25k", "text-50k", "text-100k", "text-230k", "text-450k", "text-800k", "text-1.5m")
# how raw inputs become model inputs (written into an exported model's JSON, oresearcher.export)
PREPROCESSING = {"input": "UTF-8 text", "tokenizer": "tokenizer.json (byte-level BPE)",
                 "output": "next-token logits"}


def build_model(name: str, vocab_size: int | None = None):
    """A fresh model of preset ``name`` (its own vocabulary unless told): what
    :func:`oresearcher.tasks.export.load_model` builds an export into."""
    from .model import build_model as build

    return build(name, vocab_size)


def import_tensors(tensors: dict) -> dict:
    """An export's tensors (Hugging Face GPT-2 names, :mod:`.hf`) in this project's names,
    the tied head included: what :func:`oresearcher.tasks.export.load_model` loads."""
    from .hf import from_hf, is_hf

    out = from_hf(tensors) if is_hf(tensors) else dict(tensors)
    if "tok_emb.weight" in out:
        out["lm_head.weight"] = out["tok_emb.weight"]
    return out


def make_learner(scenario, rank: int, *, mode: str, device="cpu"):
    """A :class:`.learner.TextLearner` (numeric, real), or the presets' sizes and FLOPs
    (shape mode: :class:`oresearcher.models.learner.ShapeLearner`, no data read)."""
    from ...models.learner import DTYPES, ShapeLearner
    from ...models.workloads import per_rank_batch
    from .learner import TextLearner, agent_arch, check_context, step_cost

    check_context(scenario)
    if mode == "shape":
        w = scenario.workload
        mb = per_rank_batch(scenario)
        numels, fwd, bwd = step_cost(agent_arch(scenario, rank), w.options.vocab_size, mb, w.seq_len, w.dtype)
        return ShapeLearner(numels, fwd, bwd, DTYPES[w.dtype], scenario.communication.bucket_bytes)
    return TextLearner(scenario, rank, device)


def distill_phase(ctx, learner, first_step: int, count: dict):
    """The token-level distillation phase (:mod:`.distill`): the task's own, declared on :data:`TASK`."""
    from .distill import phase

    return (yield from phase(ctx, learner, first_step, count))


def distill_comparison(learner, scenario) -> dict:
    """The report's comparison section: the student against the agents, in nats and multiple choice."""
    from .distill import comparison

    return comparison(learner, scenario)


def export_model(learner, scenario, directory):
    """The distilled student as a Hugging Face GPT-2 directory (:mod:`.hf`)."""
    from .hf import write_hf

    res = learner.distill_result
    return write_hf(directory, res["module"].cpu().eval(), learner.train_data.tokenizer_path,
                    model_name=res["arch"], metrics=res["metrics"], scenario=scenario.name)


TASK = Task(name="text", make_learner=make_learner, models=MODELS, shape_mode=True, options=TextOptions,
            build_model=build_model, preprocessing=lambda arch: PREPROCESSING, distill_phase=distill_phase,
            distill_comparison=distill_comparison, export_model=export_model, import_tensors=import_tensors)
