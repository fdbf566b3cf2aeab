"""workload.options.lr_schedule: cosine scales the rate the program sets at each optimizer
step by the pretraining recipe's factor and leaves the program's base rate in place;
constant changes nothing."""
from pathlib import Path

import pytest

from oresearcher.scenario import load_scenario
from oresearcher.tasks.text.learner import TextLearner
from oresearcher.tasks.text.pretrain import lr_at

ROOT = Path(__file__).resolve().parents[3]


def learner(cache, schedule, steps=10):
    sc = load_scenario(ROOT / "scenarios" / "text-4.yaml", [
        "workload.model=text-25k", "workload.global_batch=4", "workload.seq_len=32",
        "workload.options.vocab_size=300", "workload.options.tokenizer_corpus=bible",
        f"workload.options.cache_dir={cache}", "workload.options.init=none", "workload.options.eval_tokens=128",
        f"workload.options.lr_schedule={schedule}", f"training.steps={steps}", "training.lr=0.01"])
    return TextLearner(sc, 0)


def rates_seen(l, steps):
    seen = []
    original = l.optimizer.step

    def spy(*a, **k):
        seen.append(l.optimizer.param_groups[0]["lr"])
        return original(*a, **k)
    l.optimizer.step = spy
    for k in range(steps):
        l.forward_backward()
        if k % 2:
            l.apply_grads(l.grad_buckets())  # both of a program's ways to step
        else:
            l.optimizer_step()
    return seen


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_each_step_runs_at_the_schedules_rate_and_the_base_rate_stays(text_cache, schedule):
    l = learner(text_cache, schedule)
    seen = rates_seen(l, 12)  # two past training.steps: the floor holds
    want = [0.01 * (lr_at(k, 10, 1.0) if schedule == "cosine" else 1.0) for k in range(12)]
    assert seen == pytest.approx(want, rel=1e-12)
    assert l.optimizer.param_groups[0]["lr"] == 0.01  # what the program set, untouched


def test_the_schedules_clock_resumes_from_a_state_dict(text_cache):
    a = learner(text_cache, "cosine")
    rates_seen(a, 3)
    b = learner(text_cache, "cosine")
    b.load_state_dict(a.state_dict())
    assert b.opt_steps == 3 and b.lr_factor() == pytest.approx(lr_at(3, 10, 1.0))
