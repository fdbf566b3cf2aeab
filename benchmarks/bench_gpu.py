"""Every GPU target of the project in one run (< 5 minutes on one H200), one table.

    python benchmarks/bench_gpu.py                  # on a GPU machine: the whole check
    python benchmarks/bench_gpu.py --skip-tests     # without the pytest part
    python benchmarks/bench_gpu.py --models gpt-125m
    OMP_NUM_THREADS=1 python benchmarks/bench_gpu.py --dry-run   # CPU, tiny sizes: the script's own test

Rows of the table (``check``, ``measured``, ``model or target``, ``verdict``):

1. tests: tests/backends/test_bk_nccl.py, tests/codecs/test_codec_cuda.py (eager and
   Triton codecs on CUDA) and the CUDA token-stream test (pytest, pass/fail counts).
2. calibrate: ``python -m oresearcher.calibrate --backend=nccl`` on one GPU (its exit code
   and the GEMM rate, copy bandwidth and launch cost it wrote), and with every GPU of the
   machine when there are several (the collective sweep, fabric fitted).
3. steps: for gpt-125m, gpt-350m and gpt-1.3b, world size 1, 8 x 2048 tokens, bf16
   autocast with fp32 masters, activation checkpointing, AdamW: the simulator's flat,
   roofline and calibrated-roofline predictions of fwd+bwd+optimizer beside the measured
   median (synchronised, 5 steps after 3 warm-up; target within 10%), the data path's
   share of the step (time inside ``next(batches)``, prefetched; target < 2% for
   gpt-125m) and simulated memory beside ``torch.cuda.max_memory_allocated`` (target
   within 10%).
4. codecs: encode+decode vs a device copy at 1M, 25M and 256M elements, eager
   (``ORESEARCHER_TRITON=0``) and fused (Triton), ``x copy`` = copy time / codec time
   (target int8 >= 0.5 at 25M and 256M); exact ``torch.topk`` against the sampled
   threshold at 1% (the rule that ``topk:R:approx`` runs exact top-k on CUDA).

The built-in device profile is picked by the CUDA device name (H200, H100, A100; else
H100-SXM). ``--dry-run`` (alias ``--device cpu``) runs every row on the CPU at tiny sizes
(gpt-tiny, 2 x 64 tokens, 4K/64K elements, the cpu-local profile; the one-GPU calibration
runs its measurements on the CPU, as the nccl CLI would on cuda:0), so a GPU machine's run
is this one command. Without CUDA and without ``--dry-run`` it prints one line and exits 2.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MODELS = ("gpt-125m", "gpt-350m", "gpt-1.3b")
CODECS = ("int8", "int8:stochastic", "ef(int8)", "bf16", "fp16", "randk:0.01", "topk:0.01")
SIZES = (2**20, 25 * 2**20, 256 * 2**20)
TESTS = ["tests/backends/test_bk_nccl.py", "tests/codecs/test_codec_cuda.py",
         "tests/tasks/test_token_stream.py::test_prefetcher_on_cuda_matches_cpu"]
DRY = {"models": ("gpt-tiny",), "sizes": (2**12, 2**16), "set": ["workload.seq_len=64", "workload.global_batch=2"],
       "steps": 2, "warmup": 1}


class Mode:
    """What differs between the GPU run and the CPU dry run."""

    def __init__(self, dry: bool):
        self.dry, self.device = dry, "cpu" if dry else "cuda"
        self.sizes = DRY["sizes"] if dry else SIZES
        self.extra = DRY["set"] if dry else []
        self.steps, self.warmup = (DRY["steps"], DRY["warmup"]) if dry else (5, 3)
        self.profile = "cpu-local" if dry else profile_name()

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()


def profile_name() -> str:
    name = torch.cuda.get_device_name(0)
    for key, prof in (("H200", "H200"), ("H100", "H100-SXM"), ("A100", "A100-SXM4-80GB")):
        if key in name:
            return prof
    return "H100-SXM"


def run_tests() -> tuple:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=REPO,
                         capture_output=True, text=True, timeout=240)
    last = (out.stdout.strip().splitlines() or ["no output"])[-1]
    return ("tests (NCCL, CUDA codecs, stream)", last, "all pass", "ok" if out.returncode == 0 else "FAIL")


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


def overrides(model: str, device: str, mode: Mode) -> list:
    return [f"cluster.device={device}", "cluster.gpus_per_node=1", "agents.count=1", "agents.roles=null",
            "training.strategy=single", "workload.global_batch=8", "communication.overlap=false",
            f"workload.model={model}", "training.steps=3", *mode.extra]


def scenario(model: str, device: str, mode: Mode, more=()):
    from oresearcher.scenario import load_scenario

    return load_scenario(str(REPO / "scenarios/8xA100.yaml"), overrides(model, device, mode) + list(more))


def predicted(model: str, mode: Mode, calibrated) -> dict:
    """Simulated step seconds (flat, roofline, calibrated roofline) and memory bytes."""
    from oresearcher.sim.simulate import simulate

    flat, _ = simulate(scenario(model, mode.profile, mode))
    roof, _ = simulate(scenario(model, mode.profile + ":roofline", mode))
    out = {"flat": flat["step_time_s"], "roofline": roof["step_time_s"], "memory": flat["memory"]["total"]}
    if calibrated is not None:
        cal, _ = simulate(scenario(model, "gpu-calibrated-roofline", mode, [f"cluster.profile_files=[{calibrated}]"]))
        out["calibrated"] = cal["step_time_s"]
    return out


def measured(model: str, mode: Mode) -> tuple:
    """(median step s, data s per step, max memory allocated bytes or None on CPU)."""
    from oresearcher.tasks.synthetic_lm import make_learner

    if mode.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    learner = make_learner(scenario(model, mode.profile, mode), 0, mode="numeric", device=mode.device)
    learner.batches = _Timed(learner.batches)
    times = []
    for i in range(mode.warmup + mode.steps):
        mode.sync()
        t0 = time.perf_counter()
        learner.forward_backward()
        learner.optimizer_step()
        mode.sync()
        if i >= mode.warmup:
            times.append(time.perf_counter() - t0)
        if i == mode.warmup - 1:
            learner.batches.seconds = 0.0
    peak = torch.cuda.max_memory_allocated() if mode.device == "cuda" else None
    data = learner.batches.seconds / mode.steps
    getattr(learner.batches.it, "close", lambda: None)()
    del learner
    return statistics.median(times), data, peak


def _verdict(err: float, bound: float) -> str:
    return "ok" if abs(err) <= bound else "MISS"


def step_rows(model: str, mode: Mode, calibrated) -> list:
    p = predicted(model, mode, calibrated)
    step, data, peak = measured(model, mode)
    rows = []
    for kind in ("flat", "roofline", "calibrated"):
        if kind in p:
            err = p[kind] / step - 1
            rows.append((f"{model} step ({kind})", f"{step * 1e3:.1f} ms", f"{p[kind] * 1e3:.1f} ms ({err:+.0%})",
                         _verdict(err, 0.10)))
    share = data / step
    rows.append((f"{model} data share", f"{share:.2%}", "< 2%" if model == "gpt-125m" else "-",
                 ("ok" if share < 0.02 else "MISS") if model == "gpt-125m" else "-"))
    if peak is None:
        rows.append((f"{model} memory", "n/a on CPU", f"{p['memory'] / 1e9:.3f} GB simulated", "-"))
    else:
        err = p["memory"] / peak - 1
        rows.append((f"{model} memory", f"{peak / 1e9:.2f} GB max allocated",
                     f"{p['memory'] / 1e9:.2f} GB ({err:+.0%})",
                     _verdict(err, 0.10)))
    return rows


def _median_s(fn, mode: Mode, reps: int = 5) -> float:
    fn()
    ts = []
    for _ in range(reps):
        mode.sync()
        t0 = time.perf_counter()
        fn()
        mode.sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _size(n: int) -> str:
    return f"{n / 2**20:g}M" if n >= 2**20 else f"{n // 1024}K"


def codec_rows(mode: Mode) -> list:
    """encode+decode vs copy, eager and fused, per size; exact top-k vs sampled threshold."""
    from oresearcher.codecs import build, fused
    from oresearcher.codecs.base import RngState
    from oresearcher.codecs.sparse import k_of, threshold_topk_indices

    rows = []
    triton_here = fused.applies(torch.empty(0, device=mode.device))
    before = os.environ.get("ORESEARCHER_TRITON")
    base = "eager" if mode.device == "cuda" else "cpu path"  # on CPU int8 runs the native C kernel
    for n in mode.sizes:
        x = torch.randn(n, device=mode.device)
        copy = _median_s(lambda: x.clone(), mode)
        for spec in CODECS:
            speed = {}
            for path, env in ((base, "0"), ("triton", "1")):
                if path == "triton" and not triton_here:
                    continue
                os.environ["ORESEARCHER_TRITON"] = env
                c = build(spec)
                speed[path] = copy / _median_s(lambda: c.decode(c.encode(x)), mode)
            if before is None:
                os.environ.pop("ORESEARCHER_TRITON", None)
            else:
                os.environ["ORESEARCHER_TRITON"] = before
            target = n >= 25 * 2**20 and spec == "int8"
            got = "  ".join(f"{k} {v:.2f}x" for k, v in speed.items())
            best = max(speed.values())
            rows.append((f"codec {spec} @{_size(n)}", got + ("" if triton_here else "  (no triton)"),
                         ">= 0.5x copy" if target else "-", ("ok" if best >= 0.5 else "MISS") if target else "-"))
        k = k_of(0.01, n)
        exact = _median_s(lambda: torch.topk(x.abs(), k, sorted=False), mode)
        gen = RngState(0).generator(x.device)
        approx = _median_s(lambda: threshold_topk_indices(x, k, gen, 0.1), mode)
        rows.append((f"topk 1% @{_size(n)}", f"exact {exact * 1e3:.3f} ms", f"sampled threshold {approx * 1e3:.3f} ms",
                     "exact faster" if exact <= approx else "threshold faster"))
        rows.append((f"copy @{_size(n)}", f"{copy * 1e3:.3f} ms", f"{2 * 4 * n / copy / 1e9:.0f} GB/s r+w", "-"))
    return rows


def calibrate_rows(mode: Mode, out: Path) -> tuple:
    """(rows, profile file or None): the one-GPU nccl calibration, and the multi-GPU one."""
    import yaml

    one = overrides("gpt-125m" if not mode.dry else "gpt-tiny", mode.profile, mode)
    if mode.dry:  # the nccl CLI refuses a CPU: run the same measurements on it directly
        from oresearcher.backends.calibration.device import calibrate_device
        from oresearcher.scenario import load_scenario

        torch.set_num_threads(1)
        calibrate_device(load_scenario(str(REPO / "scenarios/8xA100.yaml"), one), out, "gpu-calibrated", "cpu", 1)
        rc, how = 0, "calibrate_device(cpu)"
    else:
        cmd = [sys.executable, "-m", "oresearcher.calibrate", "--backend=nccl", "--scenario", "scenarios/8xA100.yaml",
               "--out", str(out)] + [a for s in one for a in ("--set", s)]
        rc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180).returncode
        how = "calibrate --backend=nccl (1 GPU)"
    if rc != 0 or not out.exists():
        return [(how, f"exit {rc}", "exit 0", "FAIL")], None
    flat, roof = list(yaml.safe_load_all(out.read_text()))
    got = (f"GEMM {flat['peak_flops']['fp32'] / 1e12:.3g} TFLOP/s, copy {roof['memory_bandwidth_GBps']:.4g} GB/s, "
           f"launch {roof['launch_us']:.3g} us")
    rows = [(how, got, "exit 0", "ok")]
    gpus = torch.cuda.device_count() if not mode.dry else 1
    if gpus > 1:
        many = [s for s in one if not s.startswith(("cluster.gpus_per_node", "agents.count", "training.strategy"))]
        cmd = [sys.executable, "-m", "oresearcher.calibrate", "--backend=nccl", "--scenario", "scenarios/8xA100.yaml",
               "--out", str(out.with_name("fabric.yaml")), "--max-bytes", "64e6", "--repeats", "3", "--compute-steps",
               "3"] + [a for s in many + [f"agents.count={gpus}", f"cluster.gpus_per_node={gpus}",
                                         "training.strategy=ddp"] for a in ("--set", s)]
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
        rows.append((f"calibrate --backend=nccl ({gpus} GPUs)", f"exit {r.returncode}", "exit 0",
                     "ok" if r.returncode == 0 else "FAIL"))
    else:
        rows.append(("collective sweep", "n/a: one device", "world size > 1", "-"))
    return rows, out


def table(rows: list) -> str:
    heads = ("check", "measured", "model or target", "verdict")
    w = [max(len(str(r[i])) for r in [heads] + rows) for i in range(4)]
    line = lambda r: "  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip()  # noqa: E731
    return "\n".join([line(heads), line(tuple("-" * x for x in w))] + [line(r) for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--dry-run", action="store_true", help="every row on the CPU at tiny sizes (CI)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same as --dry-run")
    a = ap.parse_args(argv)
    dry = a.dry_run or a.device == "cpu"
    if not dry and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; run it on a GPU machine (or --dry-run on CPU)", file=sys.stderr)
        return 2
    mode = Mode(dry)
    t0 = time.perf_counter()
    where = "CPU dry run" if mode.dry else torch.cuda.get_device_name(0)
    rows = [] if a.skip_tests else [run_tests()]
    with tempfile.TemporaryDirectory() as tmp:
        cal_rows, calibrated = calibrate_rows(mode, Path(tmp) / "profile.yaml")
        rows += cal_rows
        for model in a.models or (DRY["models"] if mode.dry else MODELS):
            rows += step_rows(model, mode, calibrated)
    rows += codec_rows(mode)
    print(f"bench_gpu on {where} (profile {mode.profile}), torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
          f"{time.perf_counter() - t0:.0f} s")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
