"""The text task's scenario options (``workload.options``), checked when the scenario loads.

    workload:
      task: text
      model: text-100k
      options:
        corpus: bible            # what the agents train on (the second domain)
        init: pretrain           # every agent starts from the base pretrained on pretrain.corpus
        pretrain: {corpus: sotu, steps: 300}

``init``: ``none`` (a fresh GPT-2 initialisation from the scenario seed), ``pretrain`` (the base
model pretrained on ``pretrain.corpus``, found in the cache or trained there once:
:mod:`oresearcher.tasks.text.pretrain`) or the path of a checkpoint directory (``model.safetensors``
beside ``config.json``: a base this project saved, or a Hugging Face GPT-2 export of it).
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from ...strict import Float, Int, Strict

MAX_STEPS = 10**7

CORPORA = ("sotu", "bible")
Corpus = Literal["sotu", "bible"]


class PretrainOptions(Strict):
    """How the base model is pretrained (part of its cache key: change one, get another base)."""

    corpus: Corpus = Field("sotu", description="the pretraining corpus (the first domain)")
    steps: Int = Field(300, ge=1, le=MAX_STEPS, description="AdamW steps")
    batch: Int = Field(16, ge=1, le=4096, description="sequences of the model's full context per step")
    lr: Float = Field(0.003, gt=0, le=1, description="peak learning rate (linear warm-up, cosine decay)")
    seed: Int = Field(0, ge=0, le=2**32 - 1, description="initialisation and data order of the base")


class TextOptions(Strict):
    """``workload.options`` of ``task: text`` (see the module doc)."""

    corpus: Corpus = Field("bible", description="the corpus the agents train and are scored on")
    tokenizer_corpus: Corpus = Field("sotu", description="whose training documents the byte-level BPE "
                                     "tokenizer is trained on (shared by both corpora)")
    vocab_size: Int = Field(1024, ge=1, le=1 << 16, description="BPE vocabulary (tokens; what can be trained "
                            "is checked when the corpus is prepared); the model's embedding is this wide")
    init: str = Field("none", min_length=1, max_length=4096,
                      description="none | pretrain | PATH of a checkpoint directory")
    pretrain: PretrainOptions = Field(default_factory=PretrainOptions)
    dropout: tuple[Float, Float] = Field((0.0, 0.1), description="each agent's residual dropout is drawn "
                                         "uniformly from this range by the scenario seed (heterogeneous clones)")
    eval_tokens: Int = Field(8192, ge=128, le=10**8, description="validation tokens each evaluation scores")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="constant: training.lr throughout; cosine: linear warm-up over the first 10% of "
        "training.steps, then cosine decay to 10% (the pretraining recipe), scaling whatever rate the program "
        "sets (a role's, PBT's) at each optimizer step")
    mc_questions: Int = Field(100, ge=1, le=100_000, description="multiple-choice questions of the benchmark")
    mc_choices: Int = Field(4, ge=2, le=16, description="choices per question (chance = 1 / choices)")
    cache_dir: Optional[str] = Field(None, max_length=4096, description="prepared corpora and bases "
                                     "(None: ~/.cache/oresearcher/text)")

    @model_validator(mode="after")
    def _ranges(self):
        lo, hi = self.dropout
        if not 0.0 <= lo <= hi < 1.0:
            raise ValueError(f"dropout: a range 0 <= low <= high < 1 (got {lo}, {hi})")
        return self
