"""Distillation into one model (oresearcher.cooperation.distill) and the export (oresearcher.tasks.export).

The loss by hand; the phase in the reference interpreter (every rank ends with the same
student, data split over ranks) and priced by the simulator; the export reloads bit for
bit and refuses, in one line, anything malformed or tampered with.
"""
import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from oresearcher.cooperation.distill import kd_loss
from oresearcher.errors import UserError, cli_main
from oresearcher.export import main as export_main
from oresearcher.tasks.export import load_model, save_model
from oresearcher.programs import AgentContext, get_program
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner
from oresearcher.tasks.digits import PREPROCESSING, build_model
from oresearcher.testing import run_programs

HETERO = Path(__file__).resolve().parents[2] / "scenarios" / "digits-hetero.yaml"
SMALL = ["training.steps=8", "communication.interval=4", "cooperation.ensemble.epochs=5", "distill.steps=30"]


def test_kd_loss_by_hand():
    g = torch.Generator().manual_seed(0)
    s, t, y = torch.randn(6, 10, generator=g), torch.randn(6, 10, generator=g), torch.randint(10, (6,), generator=g)
    assert torch.allclose(kd_loss(s, t, y, 4.0, 0.0), F.cross_entropy(s, y))
    assert float(kd_loss(t, t, y, 4.0, 1.0)) == pytest.approx(0.0, abs=1e-6)
    p_t, log_p_s = (t / 2).softmax(-1), (s / 2).log_softmax(-1)
    kl = (p_t * (p_t.log() - log_p_s)).sum(-1).mean() * 4  # T^2 = 4
    assert float(kd_loss(s, t, y, 2.0, 0.5)) == pytest.approx(float(0.5 * kl + 0.5 * F.cross_entropy(s, y)), rel=1e-5)


def test_distillation_in_the_reference_interpreter_and_the_simulator():
    sc = load_scenario(HETERO, SMALL)
    learners = [make_learner(sc, r, mode="numeric") for r in range(4)]
    prog = get_program("oresearcher")
    steps = run_programs([prog(AgentContext(r, 4, sc, mode="numeric"), l) for r, l in enumerate(learners)])
    students = [l.distill_result["module"] for l in learners]
    for s in students[1:]:  # averaged gradients from one initialisation: one student
        for a, b in zip(students[0].parameters(), s.parameters()):
            assert torch.equal(a, b)
    last = steps[0][-1]
    assert last.step == sum(len(per) for per in [steps[0]]) - 1  # StepDones continue the numbering
    m = last.metrics
    print({k: round(v, 4) for k, v in m.items() if "accuracy" in k})
    assert m["student_test_accuracy"] > 0.5  # far above chance (0.1) after 30 steps from these agents
    assert m["cluster_flops"] > 0
    simulate = pytest.importorskip("oresearcher.sim.simulate").simulate
    report, _ = simulate(sc)
    names = {b["name"] for b in report["breakdown"]}
    assert {"distill_grad", "flops_total"} <= names  # priced: the phase's collectives and compute
    sim_last = report["metrics"]["0"][-1]
    assert sim_last["student_test_accuracy"] == pytest.approx(m["student_test_accuracy"])


def _saved(tmp_path):
    torch.manual_seed(3)
    model = build_model("mlp")
    out = save_model(tmp_path / "m", model, task="digits", architecture="mlp", preprocessing=PREPROCESSING,
                     n_classes=10, metrics={"student_test_accuracy": 0.5})
    return model, out


def test_export_reloads_bit_identically(tmp_path, capsys):
    model, out = _saved(tmp_path)
    loaded, meta = load_model(out)
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b) and a.dtype == b.dtype, k
    x = torch.rand(5, 64)
    assert torch.equal(model.eval()(x), loaded(x))
    assert meta["architecture"] == "mlp" and meta["preprocessing"]["scale"].startswith("divide by 16")
    assert b"pickle" not in (out / "model.safetensors").read_bytes()[:8]
    assert cli_main(export_main, [str(out)]) == 0
    assert "weights verified" in capsys.readouterr().out


def _refused(out, capsys, *needles):
    with pytest.raises(UserError) as e:
        load_model(out)
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in needles), str(e.value)
    assert cli_main(export_main, [str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")


def test_malformed_or_tampered_exports_are_refused_in_one_line(tmp_path, capsys):
    _, out = _saved(tmp_path)
    weights, meta_path = out / "model.safetensors", out / "model.json"
    good_weights, good_meta = weights.read_bytes(), meta_path.read_text()
    blob = bytearray(good_weights)
    blob[-3] ^= 0xFF  # one flipped bit pattern in a tensor
    weights.write_bytes(bytes(blob))
    _refused(out, capsys, "SHA-256")
    weights.write_bytes(good_weights[:-10])  # truncated
    _refused(out, capsys, "SHA-256")
    weights.write_bytes(good_weights)
    for text, needle in [("{not json", "not valid JSON"), ("[1, 2]", "JSON object"),
                         (good_meta.replace('"task": "digits"', '"task": "chess"'), "unknown task"),
                         (good_meta.replace('"format": "oresearcher-model/1"', '"format": "x/9"'), "format"),
                         (good_meta.replace('"n_classes": 10', '"n_classes": "10"'), "n_classes")]:
        meta_path.write_text(text)
        _refused(out, capsys, needle)
    # the right hash but the wrong architecture: names and shapes are checked
    meta_path.write_text(good_meta.replace('"architecture": "mlp"', '"architecture": "mlp-wide"'))
    _refused(out, capsys, "mlp-wide")
    # a pickle in place of the weights, hash updated to match: never unpickled, refused
    import hashlib
    weights.write_bytes(pickle.dumps({"0.weight": [1.0]}))
    meta = json.loads(good_meta)
    meta["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))
    _refused(out, capsys, "not a safetensors file")
    (out / "model.json").unlink()
    _refused(out, capsys, "no such file")


def test_shape_mode_prices_distillation_per_step():
    """A language-model cluster in shape mode: each distillation step adds the same
    simulated time (the teachers' forwards, the student's step, its all-reduce)."""
    simulate = pytest.importorskip("oresearcher.sim.simulate").simulate
    tiny = Path(__file__).resolve().parents[2] / "scenarios" / "cpu-tiny.yaml"
    base = ["training.strategy=oresearcher", "training.steps=4", "communication.interval=2"]
    times = {}
    for steps in (0, 3, 6):
        extra = ["distill.student=gpt-tiny", f"distill.steps={steps}"] if steps else []
        report, _ = simulate(load_scenario(tiny, base + extra), mode="shape")
        times[steps] = report["total_time_s"]
        if steps:
            assert "distill_grad" in {b["name"] for b in report["breakdown"]}
    assert times[3] > times[0]
    assert times[6] - times[3] == pytest.approx(times[3] - times[0], rel=0.05)


def test_a_task_without_distillation_support_is_one_line(tmp_path, capsys):
    from oresearcher.sim.__main__ import main as sim_main

    cartpole = Path(__file__).resolve().parents[2] / "scenarios" / "cartpole-4.yaml"
    code = cli_main(sim_main, [str(cartpole), "--set", "distill.student=mlp", "--set", "training.steps=2", "--out",
                               str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot be distilled" in err, err


def test_student_started_from_the_fused_agents_holds_them_exactly():
    from oresearcher.cooperation.distill import build_student, fused_params

    g = torch.Generator().manual_seed(5)
    numel = sum(p.numel() for p in build_model("mlp").parameters())
    flats = [torch.randn(numel + 7, generator=g) for _ in range(4)]  # padded, as gathered
    flats[2][0] = float("nan")  # an excluded agent must not enter the mean
    ids, excluded = ["mlp", "mlp", "mlp", "cnn"], [False, False, True, False]
    fused = fused_params(flats, ids, excluded, "mlp")
    want = (flats[0].double() + flats[1].double()) / 2  # by hand: the two healthy mlp agents
    assert torch.equal(fused, want)
    student = build_student("digits", "mlp", 0, fused)
    got = torch.nn.utils.parameters_to_vector(student.parameters())
    assert torch.equal(got, want[:numel].float())
    fresh = torch.nn.utils.parameters_to_vector(build_student("digits", "mlp", 0).parameters())
    assert not torch.equal(fresh, got)
    assert fused_params(flats, ids, excluded, "lstm") is None  # no agent of that architecture: a fresh student


def test_teacher_labels_only_what_the_student_draws():
    from oresearcher.cooperation.distill import label_rows

    rows = label_rows(270, 15, 16, seed=3)
    assert len(rows) == 240 and len(set(rows.tolist())) == 240 and int(rows.max()) < 270
    assert len(label_rows(100, 15, 16, seed=3)) == 100  # the whole shard when the student draws more
    assert torch.equal(rows, label_rows(270, 15, 16, seed=3))


def test_fused_init_needs_an_agent_of_the_students_architecture():
    with pytest.raises(UserError, match="distill.init: fused"):
        load_scenario(HETERO, ["distill.init=fused", "distill.student=cnn",
                               "agents.architectures=[mlp, mlp, lstm, lstm]"])
