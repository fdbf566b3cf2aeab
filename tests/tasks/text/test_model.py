"""The text task's models: presets, FLOPs from the counter, shape mode, checkpoints, dropout,
the scenario's options, and the one-line refusals (exit 2, nothing written)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from oresearcher.errors import UserError
from oresearcher.models.learner import ShapeLearner
from oresearcher.models.workloads import measure_lm
from oresearcher.scenario import load_scenario
from oresearcher.tasks import make_learner, model_names
from oresearcher.tasks.text import MODELS, import_tensors
from oresearcher.tasks.text.hf import from_hf, to_hf
from oresearcher.tasks.text.learner import agent_dropout
from oresearcher.tasks.text.model import add_dropout, build_model, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[3]
TEXT4 = ROOT / "scenarios" / "text-4.yaml"


def _non_embedding(m) -> int:
    return sum(p.numel() for p in m.parameters()) - m.tok_emb.weight.numel() - m.pos_emb.weight.numel()


def test_presets_span_6k_to_1_5m_non_embedding_parameters_in_order():
    sizes = [_non_embedding(build_model(n, device="meta")) for n in MODELS]
    assert sizes == sorted(sizes)
    named = [6e3, 12e3, 25e3, 50e3, 100e3, 230e3, 450e3, 800e3, 1.5e6]
    for name, got, want in zip(MODELS, sizes, named):
        assert abs(got - want) / want < 0.05, (name, got)
    m = build_model("text-100k")
    assert m.lm_head.weight is m.tok_emb.weight and m.cfg.style == "gpt" and m.cfg.max_seq_len == 128
    assert model_names("text") == MODELS


def test_flops_come_from_the_counter_and_shape_mode_prices_the_same_preset():
    sc = load_scenario(TEXT4, ["simulation.mode=shape"])
    shape = make_learner(sc, 0, mode="shape")
    cost = measure_lm("text-100k", 8, 128, "fp32")
    assert isinstance(shape, ShapeLearner)
    assert (shape.fwd_flops, shape.bwd_flops) == (cost.fwd_flops, cost.bwd_flops)
    assert shape.numel == sum(p.numel() for p in build_model("text-100k").parameters())
    # matmuls by hand: 2 FLOPs per multiply-add, 12 d^2 per layer and token plus the head, and
    # attention's two T x T products (forward)
    c = build_model("text-100k", device="meta").cfg
    linear = 2 * 8 * 128 * (c.n_layer * 12 * c.d_model ** 2 + c.d_model * c.vocab_size)
    assert cost.fwd_flops == linear + c.n_layer * 4 * 8 * 128 * 128 * c.d_model


def test_a_checkpoint_round_trips_bit_for_bit(tmp_path):
    torch.manual_seed(1)
    a = build_model("text-25k")
    save_checkpoint(tmp_path / "ck", a, "text-25k", {"note": 1})
    b = build_model("text-25k")
    load_checkpoint(b, tmp_path / "ck", "text-25k")
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k
    assert b.lm_head.weight is b.tok_emb.weight


def test_a_checkpoint_of_another_shape_names_the_tensor(tmp_path):
    save_checkpoint(tmp_path / "ck", build_model("text-25k"), "text-25k")
    with pytest.raises(UserError) as e:
        load_checkpoint(build_model("text-100k"), tmp_path / "ck", "text-100k")
    msg = str(e.value)
    assert "\n" not in msg and "tensor " in msg and "text-100k needs" in msg and "another shape" in msg
    with pytest.raises(UserError, match="no such file"):
        load_checkpoint(build_model("text-25k"), tmp_path / "nothing", "text-25k")


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(MODELS[:3]), st.integers(0, 2**31))
def test_hugging_face_names_round_trip(name, seed):
    torch.manual_seed(seed)
    sd = build_model(name).state_dict()
    back = import_tensors(to_hf(sd))
    assert set(back) == set(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    assert from_hf(to_hf(sd)).keys() == {k for k in sd if k != "lm_head.weight"}


def test_dropout_is_drawn_per_agent_in_range_and_only_acts_in_training():
    ps = [agent_dropout(0, r, 0.0, 0.1) for r in range(4)]
    assert all(0.0 <= p <= 0.1 for p in ps) and len(set(ps)) == 4
    assert ps == [agent_dropout(0, r, 0.0, 0.1) for r in range(4)]  # the seed decides
    torch.manual_seed(0)
    m = build_model("text-25k")
    x = torch.randint(0, 1024, (2, 16))
    with torch.no_grad():
        before = m.eval()(x)
        add_dropout(m, 0.5)
        assert torch.equal(m.eval()(x), before)
        assert not torch.equal(m.train()(x), before)


def test_options_are_checked_when_the_scenario_loads():
    sc = load_scenario(TEXT4)
    assert sc.workload.options.corpus == "bible" and sc.workload.options.init == "pretrain"
    with pytest.raises(UserError, match="workload.options"):
        load_scenario(TEXT4, ["workload.options.nonsense=1"])
    with pytest.raises(UserError, match="dropout"):
        load_scenario(TEXT4, ["workload.options.dropout=[0.5, 0.2]"])
    digits = ROOT / "scenarios" / "digits-4.yaml"
    with pytest.raises(UserError, match="takes no options"):
        load_scenario(digits, ["workload.options={a: 1}"])
    assert "options" not in load_scenario(digits).resolved()["workload"]  # other reports unchanged


def _sim(tmp_path, *sets):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "oresearcher.sim", str(TEXT4), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"OMP_NUM_THREADS": "1", "PATH": "", "HOME": str(tmp_path)})
    return proc, out


@pytest.mark.parametrize("sets, says", [
    (["workload.seq_len=256"], "longer than text-100k's context of 128"),
    (["workload.model=text-7b"], "unknown model for task text"),
    (["workload.options.init=CKPT"], "another shape"),
])
def test_bad_inputs_get_one_line_exit_2_and_nothing_written(tmp_path, sets, says):
    save_checkpoint(tmp_path / "ck", build_model("text-25k"), "text-25k")
    sets = [s.replace("CKPT", str(tmp_path / "ck")) for s in sets]
    proc, out = _sim(tmp_path, "workload.options.vocab_size=1024", *sets)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not out.exists()


def test_the_simulator_prices_text_in_shape_mode_without_reading_a_corpus(tmp_path):
    from oresearcher.sim.simulate import simulate

    sc = load_scenario(TEXT4, ["simulation.mode=shape", "training.steps=4", f"workload.options.cache_dir={tmp_path}"])
    report, _ = simulate(sc)
    assert report["mode"] == "shape" and report["compute_time_s"] > 0
    assert not any(tmp_path.iterdir())  # nothing prepared, nothing pretrained
