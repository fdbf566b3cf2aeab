"""Every task is one declared Task (oresearcher.tasks.spec): the scenario resolves
workload.task to it at load, and workload.options is checked against the options model
the task declares (a task without one takes none)."""
import dataclasses
from pathlib import Path

import pytest
from pydantic import Field

from oresearcher.errors import UserError
from oresearcher.scenario import Strict, load_scenario
from oresearcher.tasks import TASKS, digits, get_task, model_names
from oresearcher.tasks.spec import Task

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
DIGITS4 = SCENARIOS / "digits-4.yaml"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_module_declares_its_task(name):
    task = get_task(name)
    assert isinstance(task, Task) and task.name == name and task.models == model_names(name)
    assert callable(task.make_learner)
    assert not task.shardable or task.language_model  # fsdp shards transformer blocks


def test_the_scenario_resolves_its_task_and_keeps_the_name_in_the_report():
    sc = load_scenario(DIGITS4)
    assert sc.task is get_task("digits")
    assert sc.resolved()["workload"]["task"] == "digits" and "options" not in sc.resolved()["workload"]


def test_options_are_refused_for_a_task_that_declares_none():
    with pytest.raises(UserError, match="workload.options: task digits takes no options"):
        load_scenario(DIGITS4, ["workload.options={corpus: sotu}"])


class DigitsOptions(Strict):
    corpus: str = Field("sotu", pattern="^(sotu|bible)$")
    vocab_size: int = Field(1024, ge=256, le=65536)


@pytest.fixture
def with_options(monkeypatch):
    monkeypatch.setattr(digits, "TASK", dataclasses.replace(digits.TASK, options=DigitsOptions))


def test_options_are_typed_by_the_tasks_model(with_options):
    sc = load_scenario(DIGITS4, ["workload.options={vocab_size: 512}"])
    assert isinstance(sc.workload.options, DigitsOptions)
    assert (sc.workload.options.corpus, sc.workload.options.vocab_size) == ("sotu", 512)
    assert sc.resolved()["workload"]["options"] == {"corpus": "sotu", "vocab_size": 512}
    assert load_scenario(DIGITS4).workload.options == DigitsOptions()  # absent: the model's defaults


@pytest.mark.parametrize("bad, words", [("{vocab_size: 9}", "workload.options: vocab_size"),
                                        ("{vocab: 512}", "workload.options: vocab"),
                                        ("{corpus: wiki}", "workload.options: corpus")])
def test_bad_options_are_one_line_naming_the_field(with_options, bad, words):
    with pytest.raises(UserError) as e:
        load_scenario(DIGITS4, [f"workload.options={bad}"])
    assert words in str(e.value) and "\n" not in str(e.value)
