"""One device measured on its own: ``calibrate --backend=nccl`` on a single GPU.

    python -m oresearcher.calibrate --backend=nccl --scenario scenarios/8xA100.yaml \\
        --set cluster.gpus_per_node=1 --set agents.count=1 --set agents.roles=null \\
        --set training.strategy=single --set cluster.device=H200 --out runs/h200/profile.yaml

With one rank there is no collective to sweep: the command measures the device
(:func:`measure_device`) and writes two device profiles (:func:`profile_text`):

- ``NAME`` (default ``gpu-calibrated``), flat: ``peak_flops`` = the achieved GEMM rate at
  the workload's shapes, ``efficiency`` 1, the interpreter's host cost per Compute op;
- ``NAME-roofline``: the roofline model (``sim/roofline.py``) with that GEMM rate as
  peak, the attention rate, the memory bandwidth of a device copy and the launch cost per
  kernel, all measured (``backends/calibration/device_rates.py``).

A scenario uses them with ``cluster.profile_files: [profile.yaml]`` and
``cluster.device: gpu-calibrated`` (or ``gpu-calibrated-roofline``). With more than one
rank, ``--backend=nccl`` runs the gloo path's collective sweep on NCCL ranks and writes
the fabric profile too, with the roofline rates measured on rank 0.

Every function takes the device, so CPU tests run the same measurements
(``device="cpu"``); only :func:`run_cli` is specific to CUDA. The hot square GEMM
(:func:`square_gemm_rate`) is reported beside the workload's cold GEMM rate, to show how
far the workload's shapes run from the device's best.
"""
from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path

import torch
import yaml

from . import device_rates
from oresearcher.calibration.profiles import profile_fields
from oresearcher.comm.units import US

log = logging.getLogger("oresearcher.calibrate")


def square_gemm_rate(n: int, dtype: str = "fp32", repeats: int = 9, device="cpu") -> float:
    """FLOP/s of an ``n x n`` GEMM with the same operands each time (the device's best)."""
    dt = device_rates.DTYPES[dtype]
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    return 2.0 * n ** 3 / device_rates._median_s(lambda: torch.mm(a, b), repeats, device)


def memory_bytes(device) -> float:
    """Memory of one device: the GPU's, or this host's RAM on CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return float(torch.cuda.get_device_properties(dev).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def describe(device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores), torch {torch.__version__}"


def measure_device(model: str, micro_batch: int, seq_len: int, dtype: str = "fp32", device="cpu",
                   repeats: int = 9) -> dict:
    """The roofline rates at ``model``'s shapes (:func:`device_rates.measure_rates`), the hot
    square GEMM, the host cost of one Compute op, the device's memory and a description."""
    from oresearcher.backends.calibration.measure import measure_host_overhead

    dev = torch.device(device)
    rates = device_rates.measure_rates(model, micro_batch, seq_len, dtype, dev, repeats)
    n = 8192 if dev.type == "cuda" else 512
    return {**rates, "square_gemm_n": n, "square_gemm_flops": square_gemm_rate(n, dtype, repeats, dev),
            "host_overhead_s": measure_host_overhead(0, 1, dev, ops=500), "memory_bytes": memory_bytes(dev),
            "foreach_optimizer": dev.type == "cuda", "device": describe(dev), "dtype": dtype,
            "shapes": f"{model}, micro batch {micro_batch} x {seq_len} tokens"}


def device_docs(name: str, m: dict) -> list[dict]:
    """The flat and the roofline device profile for measurement ``m``."""
    rate = m["matmul_flops"]
    peak = {"fp32": rate, "bf16": rate, "fp16": rate}  # measured at m's dtype only (see the header)
    flat = {"kind": "device", "name": name, "peak_flops": peak, "efficiency": 1.0,
            "memory_bytes": m["memory_bytes"], "host_overhead_us": m["host_overhead_s"] / US}
    roof = {**flat, "name": name + "-roofline", "compute_model": "roofline",
            "foreach_optimizer": bool(m["foreach_optimizer"]), **profile_fields(m)}
    return [flat, roof]


def profile_text(name: str, m: dict) -> str:
    """The profile file: a header with what was measured and how, then the documents."""
    head = [
        f"# Calibrated by `python -m oresearcher.calibrate` (one device) on {platform.node()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}: {m['device']}.",
        f"# {m['dtype']} at {m['shapes']}: GEMM {m['matmul_flops'] / 1e12:.4g} TFLOP/s (cold operands), "
        f"attention {m['attention_flops'] / 1e12:.4g} TFLOP/s, copy {m['memory_bandwidth_Bps'] / 1e9:.4g} GB/s "
        f"(read + write), launch {m['launch_s'] / US:.3g} us per kernel, host {m['host_overhead_s'] / US:.3g} us "
        "per Compute op.",
        f"# square GEMM n={m['square_gemm_n']}, operands hot: {m['square_gemm_flops'] / 1e12:.4g} TFLOP/s "
        "(the device's best; not used by the profiles).",
        f"# peak_flops holds the {m['dtype']} rate under every dtype: only {m['dtype']} was measured.",
    ]
    return "\n".join(head) + "\n" + yaml.safe_dump_all(device_docs(name, m), sort_keys=False)


def write_device_profile(path: Path, name: str, m: dict) -> None:
    from oresearcher.files import write_text

    write_text(path, profile_text(name, m))  # atomic, never through a link


def calibrate_device(scenario, out: Path, name: str, device="cpu", repeats: int = 9) -> dict:
    """Measure ``device`` at the scenario's language-model shapes and write the profiles."""
    from oresearcher.errors import UserError
    from oresearcher.models.workloads import per_rank_batch

    w = scenario.workload
    if not scenario.task.language_model:
        raise UserError(f"one-device calibration measures language-model shapes; workload.task is {w.task!r} "
                        "(use workload.task=synthetic-lm)")
    m = measure_device(w.model, per_rank_batch(scenario), w.seq_len, w.dtype, device, repeats)
    write_device_profile(Path(out), name, m)
    return m


def run_cli(args, scenario) -> int:
    """``calibrate --backend=nccl`` with one rank: measure ``cuda:0``, write the profiles."""
    name = "gpu-calibrated" if args.device_name == "cpu-calibrated" else args.device_name
    out = Path(args.out or Path("runs") / scenario.name / "profile.yaml")
    m = calibrate_device(scenario, out, name, "cuda", max(3, args.repeats))
    log.info("wrote %s (%s, %s): GEMM %.4g TFLOP/s, copy %.4g GB/s, launch %.3g us", out, name, m["device"],
             m["matmul_flops"] / 1e12, m["memory_bandwidth_Bps"] / 1e9, m["launch_s"] / US)
    return 0
