"""The Learner protocol and the Program alias: what every task's learner offers the
programs, checked on each task's learner; the programs are ProgramFns."""
import inspect

import pytest
import torch

from oresearcher import ops as O
from oresearcher.programs import get_program
from oresearcher.strategies import STRATEGIES
from oresearcher.models.learner import Learner, LearnerBase, ShapeLearner
from oresearcher.scenario import load_scenario
from oresearcher.tasks import TASKS, make_learner

SCENARIO = {"synthetic-lm": "cpu-tiny", "digits": "digits-4", "cartpole": "cartpole-4", "finance": "finance",
            "text": "text-4"}


def _small(task, tmp_path) -> list[str]:
    """Overrides that keep a task's learner cheap and out of the user's cache (text: a fresh
    model, a small tokenizer, a temporary cache)."""
    return {"text": ["workload.options.init=none", f"workload.options.cache_dir={tmp_path}", "workload.model=text-25k",
            "workload.options.vocab_size=300", "workload.options.tokenizer_corpus=bible", "distill.student=null"]}.get(task, [])


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_makes_a_learner(task, tmp_path):
    sc = load_scenario(f"scenarios/{SCENARIO[task]}.yaml", _small(task, tmp_path))
    assert sc.workload.task == task
    learner = make_learner(sc, 0, mode="numeric")
    assert isinstance(learner, Learner)
    assert learner.numel > 0 and learner.fwd_flops >= 0 and learner.bwd_flops >= 0


def test_a_shape_learner_is_one_and_an_object_missing_a_member_is_not():
    assert isinstance(ShapeLearner([3, 4], 1.0, 2.0), Learner)

    class NoStep:
        numel, fwd_flops, bwd_flops = 1, 1.0, 1.0
        forward_backward = grad_buckets = apply_grads = flat_params = set_flat_params = evaluate = None
    assert not isinstance(NoStep(), Learner)  # optimizer_step missing


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_is_a_program_function(strategy):
    fn = get_program(strategy)
    assert list(inspect.signature(fn).parameters)[:2] == ["ctx", "learner"]


def test_a_program_is_a_generator_of_ops():
    learner = ShapeLearner([8], 1.0, 2.0)

    def prog() -> O.Program:
        grads = yield O.Compute(learner.grad_buckets)
        return (yield O.AllReduce(grads[0]))
    gen = prog()
    assert isinstance(next(gen), O.Op)
    assert isinstance(gen.send([torch.empty(8, device="meta")]), O.AllReduce)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_learner_declares_what_it_offers_instead_of_being_probed(task):
    """Optional capabilities are declared on LearnerBase with their "absent" value (None);
    a task's learner that has one overrides it with a method, so programs never need hasattr."""
    sc = load_scenario(f"scenarios/{SCENARIO[task]}.yaml")
    learner = make_learner(sc, 0, mode="numeric")
    assert isinstance(learner, LearnerBase) and learner.restorable and not learner.sharded
    for name in ("evaluate_params", "predict_params", "task_data", "heldout_labels", "val_size", "set_peers",
                 "set_peer_term", "set_reward_weights", "set_exploration", "set_fixed_epsilon", "use_shared_replay"):
        offered = getattr(learner, name)
        assert offered is None or callable(offered), name
    assert learner.arch_numel(learner.arch or "any") > 0


def test_a_shape_learner_offers_nothing_beyond_the_protocol():
    shape = ShapeLearner([3, 4], 1.0, 2.0)
    assert shape.module is None and shape.optimizer is None and tuple(shape.params) == ()
    assert not shape.restorable and shape.evaluate_params is None and shape.arch_numel("x") == 7
