"""Everything issue 11 asks of a GPU machine, in one run (< 5 minutes on one H200), one table.

    python benchmarks/bench_gpu.py                  # tests, steps, codecs, data path, rates
    python benchmarks/bench_gpu.py --skip-tests     # without the pytest part
    python benchmarks/bench_gpu.py --models gpt-125m

On a machine without CUDA it prints one line and exits 2.

1. tests: tests/backends/test_bk_nccl.py, tests/codecs/test_codec_cuda.py and the CUDA
   token-stream test (pytest, pass/fail counts).
2. step: for gpt-125m, gpt-350m and gpt-1.3b, world size 1, 8 x 2048 tokens, bf16
   autocast with fp32 masters, activation checkpointing, AdamW: the simulator's flat and
   roofline predictions of fwd+bwd+optimizer beside the measured median (CUDA-synchronised,
   5 steps after 3 warm-up), the data path's share of the measured step (time inside
   ``next(batches)``, prefetched), and simulated memory beside
   ``torch.cuda.max_memory_allocated``.
3. codecs: encode+decode vs a device copy at 1M, 25M and 256M elements (x copy = copy
   time / codec time).
4. rates: matmul, attention, memory bandwidth and launch cost as ``calibrate`` measures
   them (``backends/device_rates.py``) at gpt-125m's shapes, beside the profile's.

The device profile is picked by the CUDA device name (H200, H100, A100; else H100-SXM).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

MODELS = ("gpt-125m", "gpt-350m", "gpt-1.3b")
CODECS = ("int8", "int8:stochastic", "ef(int8)", "bf16", "randk:0.01", "topk:0.01")
SIZES = (2**20, 25 * 2**20, 256 * 2**20)
TESTS = ["tests/backends/test_bk_nccl.py", "tests/codecs/test_codec_cuda.py",
         "tests/tasks/test_token_stream.py::test_prefetcher_on_cuda_matches_cpu"]


def profile_name() -> str:
    name = torch.cuda.get_device_name(0)
    for key, prof in (("H200", "H200"), ("H100", "H100-SXM"), ("A100", "A100-SXM4-80GB")):
        if key in name:
            return prof
    return "H100-SXM"


def run_tests() -> str:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                         capture_output=True, text=True, timeout=240)
    return (out.stdout.strip().splitlines() or ["no output"])[-1]


class _Timed:
    """Wraps an iterator, totalling the seconds spent in ``next``."""

    def __init__(self, it):
        self.it, self.seconds = it, 0.0

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        x = next(self.it)
        self.seconds += time.perf_counter() - t0
        return x

    def __getattr__(self, name):
        return getattr(self.it, name)


def scenario(model: str, device: str):
    from oresearcher.scenario import load_scenario

    return load_scenario("scenarios/8xA100.yaml", [
        f"cluster.device={device}", "cluster.gpus_per_node=1", "agents.count=1", "agents.roles=null",
        "training.strategy=single", "workload.global_batch=8", "communication.overlap=false",
        f"workload.model={model}", "training.steps=3"])


def predicted(model: str, prof: str) -> tuple[float, float, float]:
    """(flat s, roofline s, simulated memory bytes) per step."""
    from oresearcher.sim.simulate import simulate

    flat, _ = simulate(scenario(model, prof))
    roof, _ = simulate(scenario(model, prof + ":roofline"))
    return flat["step_time_s"], roof["step_time_s"], flat["memory"]["total"]


def measured(model: str, prof: str, steps: int = 5, device: str = "cuda") -> tuple[float, float, int]:
    """(median step s, data s per step, max memory allocated bytes)."""
    from oresearcher.tasks.synthetic_lm import make_learner

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    learner = make_learner(scenario(model, prof), 0, mode="numeric", device=device)
    learner.batches = _Timed(learner.batches)
    times = []
    for i in range(3 + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        learner.forward_backward()
        learner.optimizer_step()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
        if i == 2:
            learner.batches.seconds = 0.0
    peak = torch.cuda.max_memory_allocated()
    data = learner.batches.seconds / steps
    getattr(learner.batches.it, "close", lambda: None)()
    del learner
    return statistics.median(times), data, peak


def codec_rows() -> list[str]:
    from oresearcher.codecs import build

    def med(fn, reps=5):
        fn()
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    xs = {n: torch.randn(n, device="cuda") for n in SIZES}
    copy = {n: med(lambda: xs[n].clone()) for n in SIZES}
    rows = [f"  {'codec':<18}" + "".join(f"{f'{n / 2**20:g}M x copy':>14}" for n in SIZES)]
    for spec in CODECS:
        c = build(spec)
        rows.append(f"  {spec:<18}" + "".join(f"{copy[n] / med(lambda: c.decode(c.encode(xs[n]))):>14.2f}"
                                                for n in SIZES))
    rows.append("  copy ms: " + ", ".join(f"{n / 2**20:g}M {copy[n] * 1e3:.2f}" for n in SIZES))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    from oresearcher.backends.device_rates import measure_rates
    from oresearcher.sim.hardware import builtin_profiles

    prof = profile_name()
    lines = [f"bench_gpu on {torch.cuda.get_device_name(0)} (profile {prof}), torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%d')}"]
    if not a.skip_tests:
        lines.append(f"tests: {run_tests()}")
    lines.append(f"  {'model':<10}{'flat':>10}{'roofline':>10}{'measured':>10}{'err flat':>9}{'err roof':>9}"
                 f"{'data':>8}{'mem sim':>10}{'mem max':>10}")
    for model in a.models:
        flat, roof, mem = predicted(model, prof)
        step, data, peak = measured(model, prof)
        lines.append(f"  {model:<10}{flat * 1e3:>7.1f} ms{roof * 1e3:>7.1f} ms{step * 1e3:>7.1f} ms"
                     f"{flat / step - 1:>+9.0%}{roof / step - 1:>+9.0%}{data / step:>8.1%}"
                     f"{mem / 1e9:>7.1f} GB{peak / 1e9:>7.1f} GB")
    lines += codec_rows()
    r = measure_rates("gpt-125m", 8, 2048, "bf16", device="cuda")
    d = builtin_profiles()["device", prof]
    lines.append(f"  rates: matmul {r['matmul_flops'] / 1e12:.0f} TFLOP/s (profile "
                 f"{d.peak_flops['bf16'] * d.achievable['matmul'] / 1e12:.0f}), attention "
                 f"{r['attention_flops'] / 1e12:.0f} (profile {d.peak_flops['bf16'] * d.achievable['attention'] / 1e12:.0f}),"
                 f" memory {r['memory_bandwidth_Bps'] / 1e12:.2f} TB/s (profile {d.memory_bandwidth / 1e12:.2f}),"
                 f" launch {r['launch_s'] * 1e6:.1f} us (profile {d.launch_us:.1f})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
