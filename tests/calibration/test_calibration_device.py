"""One-device calibration (backends/calibration/device.py): the measurements that
``calibrate --backend=nccl`` takes on a GPU, run on the CPU, through the CLI, into a
profile file the simulator loads and prices a step with."""
import pytest
import torch

from oresearcher.backends.calibration import device as cal
from oresearcher.errors import cli_main

ONE = ["agents.count=1", "cluster.gpus_per_node=1", "training.strategy=single", "training.steps=2"]


def test_nccl_cli_on_one_rank_writes_profiles_the_simulator_prices_with(tmp_path, monkeypatch, capsys):
    """The CLI's one-rank NCCL path with the CUDA device swapped for the CPU: the same
    functions measure, the file holds a flat and a roofline profile, and the simulator
    charges a step from them."""
    from oresearcher import calibrate
    from oresearcher.backends.run import worker
    from oresearcher.scenario import load_scenario
    from oresearcher.hardware import load_profile_file
    from oresearcher.sim.simulate import simulate

    torch.set_num_threads(1)
    seen = {}
    real = cal.calibrate_device

    def on_cpu(scenario, out, name, device, repeats):
        seen["device"] = device
        return real(scenario, out, name, "cpu", 1)

    monkeypatch.setattr(worker, "backend_unavailable", lambda backend: None)
    monkeypatch.setattr(cal, "calibrate_device", on_cpu)
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    out = tmp_path / "gpu.yaml"
    args = ["--backend=nccl", "--scenario", "scenarios/local-gloo.yaml", "--out", str(out)]
    assert cli_main(calibrate.main, args + [a for s in ONE for a in ("--set", s)]) == 0
    assert seen["device"] == "cuda"
    flat, roof = load_profile_file(out)
    assert (flat.name, roof.name) == ("gpu-calibrated", "gpu-calibrated-roofline")
    assert roof.compute_model == "roofline" and not roof.foreach_optimizer  # a CPU measured it
    text = out.read_text()
    assert "square GEMM n=512" in text and "gpt-tiny, micro batch 8 x 64 tokens" in text
    gemm = flat.peak_flops["fp32"]
    assert gemm > 1e8 and roof.peak_flops["fp32"] == gemm and roof.achievable["matmul"] == 1.0
    assert 1e8 < roof.memory_bandwidth_GBps * 1e9 < 1e13 and 0 < roof.launch_us < 1e4
    for dev in ("gpu-calibrated", "gpu-calibrated-roofline"):
        sc = load_scenario("scenarios/local-gloo.yaml", ONE + [f"cluster.profile_files=[{out}]",
                                                               f"cluster.device={dev}"])
        report, _ = simulate(sc)
        assert 0 < report["step_time_s"] < 60


def test_flat_and_roofline_documents_by_hand():
    m = {"matmul_flops": 4e14, "attention_flops": 2e14, "memory_bandwidth_Bps": 4.0e12, "launch_s": 5e-6,
         "host_overhead_s": 2e-5, "memory_bytes": 141e9, "foreach_optimizer": True}
    flat, roof = cal.device_docs("h200-cal", m)
    assert flat == {"kind": "device", "name": "h200-cal", "peak_flops": {"fp32": 4e14, "bf16": 4e14, "fp16": 4e14},
                    "efficiency": 1.0, "memory_bytes": 141e9, "host_overhead_us": pytest.approx(20.0)}
    assert roof["memory_bandwidth_GBps"] == 4000.0 and roof["launch_us"] == pytest.approx(5.0)
    assert roof["achievable"] == {"matmul": 1.0, "attention": 0.5, "vector": 1.0} and roof["foreach_optimizer"]


def test_non_language_model_scenario_is_refused(tmp_path):
    from oresearcher.errors import UserError
    from oresearcher.scenario import load_scenario

    sc = load_scenario("scenarios/digits-4.yaml")
    with pytest.raises(UserError, match="language-model shapes"):
        cal.calibrate_device(sc, tmp_path / "p.yaml", "x", "cpu", 1)
