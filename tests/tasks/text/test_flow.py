"""Pretrain, clone, cooperate, distil on real text, end to end with a tiny budget: the
simulator (numeric mode: the agents really train) and a real gloo run with --export."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oresearcher.reporting.final import language_line
from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import simulate
from oresearcher.tasks.text.learner import TextLearner
from oresearcher.tasks.text.model import build_model, load_checkpoint

ROOT = Path(__file__).resolve().parents[3]
TEXT4 = ROOT / "scenarios" / "text-4.yaml"


def tiny(cache) -> list[str]:
    """text-4 at a budget of seconds: text-25k, the small shared tokenizer, a 3-step base."""
    return ["workload.model=text-25k", "workload.global_batch=8", "workload.seq_len=64",
            "workload.options.vocab_size=300", "workload.options.tokenizer_corpus=bible",
            f"workload.options.cache_dir={cache}", "workload.options.pretrain.steps=3",
            "workload.options.pretrain.batch=2", "workload.options.eval_tokens=256",
            "workload.options.mc_questions=4", "training.steps=4", "communication.interval=2",
            "training.local_steps=2", "distill.student=text-25k", "distill.steps=2"]


def test_the_simulator_trains_four_clones_of_the_base_and_reports_the_deployed_student(text_cache):
    sc = load_scenario(TEXT4, tiny(text_cache))
    report, _ = simulate(sc)
    last = [m[-1] for _, m in sorted(report["metrics"].items())]
    assert len(last) == 4
    student = last[0]
    for key in ("student_val_loss", "student_val_bits_per_byte", "student_mc_accuracy", "base_val_loss",
                "ensemble_val_loss"):
        assert key in student and student[key] == student[key], key
    assert 0 < student["student_val_bits_per_byte"] < student["student_val_loss"] * 2
    assert student["student_mc_chance"] == 0.25
    finals = [next(x for x in reversed(m) if "val_bits_per_byte" in x) for _, m in sorted(report["metrics"].items())]
    assert all(f["val_loss"] > 0 and 0 <= f["mc_accuracy"] <= 1 for f in finals)
    assert report["final"]["deployable"]["what"] == "distilled student"
    assert report["final"]["deployable"]["value"] == pytest.approx(student["student_val_loss"])
    line = language_line(report["metrics"])
    assert line.startswith("deployed student: validation loss") and "bits/byte" in line and "chance 0.250" in line


def test_every_agent_starts_from_the_cached_base_and_differs_by_seed(text_cache):
    sc = load_scenario(TEXT4, tiny(text_cache))
    a, b = TextLearner(sc, 0), TextLearner(sc, 1)
    bases = list(Path(text_cache).glob("base-text-25k-sotu-*"))
    assert len(bases) == 1 and a.init == b.init == bases[0]  # pretrained once, then found
    base = build_model("text-25k", 300)
    load_checkpoint(base, bases[0], "text-25k")
    assert torch.equal(a.flat_params(), b.flat_params())  # clones of the base
    assert torch.equal(a.flat_params(), torch.nn.utils.parameters_to_vector(base.parameters()))
    assert a.dropout != b.dropout  # heterogeneous by the seed
    assert not torch.equal(next(a.batches), next(b.batches))  # own data order


def test_a_gloo_run_trains_the_same_program_and_exports_a_transformers_model(tmp_path, text_cache):
    two = ["agents.count=2", "cluster.gpus_per_node=2", "agents.roles={optimizer: 1, validator: 1}"]
    cmd = [sys.executable, "-m", "oresearcher.run", "--backend=gloo", "--scenario", str(TEXT4),
           *[a for s in tiny(text_cache) + two for a in ("--set", s)], "--out", str(tmp_path / "run"),
           "--no-tensorboard", "--no-progress", "--timeout=120", "--export", str(tmp_path / "model")]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["backend"] == "gloo" and report["world_size"] == 2
    section = report["distill"]
    assert section["task"] == "text" and section["export"] == str(tmp_path / "model")
    assert "nats/token" in proc.stdout and "multiple choice" in proc.stdout
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "model")).eval()
    from oresearcher.tasks.export import load_model

    ours, meta = load_model(tmp_path / "model")
    assert meta["metrics"]["student_val_loss"] == pytest.approx(section["student_val_loss"])
    x = torch.randint(0, 300, (2, 64))
    with torch.no_grad():
        assert (hf(x).logits - ours(x)).abs().max().item() < 1e-4


@pytest.mark.parametrize("n", [1, 4, 7])
def test_the_benchmark_asks_from_both_corpora_half_each(text_cache, n):
    from oresearcher.tasks.text.evaluation import questions

    sc = load_scenario(TEXT4, tiny(text_cache) + [f"workload.options.mc_questions={n}"])
    o = sc.workload.options
    qs = questions(sc)
    by = [q.corpus for q in qs.questions]
    assert len(by) == n and o.corpus != o.pretrain.corpus
    assert by.count(o.corpus) == -(-n // 2) and by.count(o.pretrain.corpus) == n // 2
    same = load_scenario(TEXT4, tiny(text_cache) + [f"workload.options.mc_questions={n}",
                                                     f"workload.options.pretrain.corpus={o.corpus}"])
    assert {q.corpus for q in questions(same).questions} == {o.corpus}
