"""``--resume`` of the cooperative program with private gradient sharing (noise generator
and accounting restored) or the shared hard-example pool (every replica, its pending rows
and the hard-example stream restored): the resumed gloo run ends bit-identical to the
uninterrupted one. The harness is tests/backends/test_bk_resume_exact.py's.
"""
from __future__ import annotations

import json
import shutil

import pytest

from oresearcher.backends.checkpoint import per_rank as ckpt
from test_bk_resume_exact import SLOW, _equal, _run, _scenario


@pytest.mark.parametrize("channel, sets", [
    # privacy's state (noise generator, step count) also resumes in tests/cooperation/test_privacy.py;
    # on gloo it runs with ORESEARCHER_SLOW_TESTS=1 (two gloo runs, ~25 s)
    pytest.param("privacy", {"enabled": True, "noise_multiplier": 1.0, "clip_norm": 1.0}, marks=SLOW),
    ("replay", {"enabled": True, "sync_every": 2, "quota": 8}),
])
def test_resume_restores_the_channel(tmp_path, child_env, channel, sets):
    import yaml

    sc = _scenario(tmp_path / "s.yaml", checkpoint_every=3)
    data = yaml.safe_load(sc.read_text())
    data["cooperation"][channel] = sets
    sc.write_text(yaml.safe_dump(data))
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(["--scenario", str(sc), "--out", str(full), "--keep_checkpoints", "0"], child_env)
    shutil.copytree(full, cut)
    for step in (7, 11):
        shutil.rmtree(ckpt.step_dir(cut, step))
    (cut / "report.json").unlink()
    _run(["--resume", str(cut), "--keep_checkpoints", "0"], child_env)
    for r in (0, 1):
        a, b = ckpt.load(ckpt.rank_file(full, 11, r)), ckpt.load(ckpt.rank_file(cut, 11, r))
        assert channel in a["states"]
        _equal(a["learner"], b["learner"], f"rank {r} learner")
        _equal(a["states"], b["states"], f"rank {r} states")
    rep_full, rep_cut = (json.loads((d / "report.json").read_text()) for d in (full, cut))
    for r in ("0", "1"):
        a, b = ({k: v for k, v in rep["metrics"][r][-1].items() if k != "time_s"} for rep in (rep_full, rep_cut))
        _equal(a, b, f"rank {r} last metrics")
    if channel == "privacy":
        assert rep_cut["metrics"]["0"][-1]["epsilon"] > 0
